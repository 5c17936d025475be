"""Ray actors of the training graph and their placement."""
