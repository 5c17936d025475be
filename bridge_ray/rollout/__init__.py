"""The sampler actor and its group: rollouts, scoring, evaluation."""
