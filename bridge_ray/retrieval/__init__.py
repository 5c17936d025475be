"""Dense retrieval: corpus I/O, encoders with a query-side LoRA, sharded FAISS indexes, top-k merge, HTTP API."""
