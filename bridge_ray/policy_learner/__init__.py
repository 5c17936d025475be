"""The policy learner role: DeepSpeed ZeRO ranks that update θ on a round's trajectories (GRPO surrogate, KL,
and with Drop and two-state the ``γ ∇θ L_RAG`` terms). The warm-up (cold-start SFT) is ``bridge_ray.warmup``."""
