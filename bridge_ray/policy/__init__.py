"""The policy role: the warm-up stage (cold-start SFT) before RL."""
