"""The search agent: prompt, tag parsing, the engine-agnostic multi-turn rollout loop, rewards, answer scoring."""
