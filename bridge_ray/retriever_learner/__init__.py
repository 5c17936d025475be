"""The retriever-LoRA learner: the eta update on a batch and its actor."""
