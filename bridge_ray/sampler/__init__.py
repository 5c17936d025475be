"""The sampler actor: rollouts, answer scoring, evaluation."""
