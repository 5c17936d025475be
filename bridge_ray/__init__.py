"""bridge-ray: Ray-native BRIDGE trainer for retrieval-augmented agentic RL."""

__version__ = "0.1.0"
