"""The warm-up (cold-start SFT): teaching the policy the search protocol before RL (``trainer``)."""
