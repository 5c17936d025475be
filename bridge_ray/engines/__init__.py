"""Generation backends behind one interface: vLLM and Hugging Face transformers."""
