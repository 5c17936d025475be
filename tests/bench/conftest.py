"""The policy that bench landscape and bench estimators need: one that searches (both differentiate or perturb
L_RAG, which needs retrieval turns)."""

import pytest
from job_fixtures import tiny_policy_overrides


@pytest.fixture(scope="module")
def searching(module_dir, gemma_vocab_policy, small_world, world_index):
    """(folder, overrides): a job whose policy is the tiny Gemma with Gemma's tokenizer, warmed up (once per module,
    cached in its folder) to search."""
    train = module_dir / "train.jsonl"  # one question: the warm-up's demonstration is the batch's question
    train.write_text((small_world / "train.jsonl").read_text().splitlines()[0] + "\n")
    overrides = [*tiny_policy_overrides(gemma_vocab_policy), f"data.train=[\"{train}\"]",
                 f"retrieval.index.dir={world_index}", "warmup.enabled=true", "warmup.examples=1",
                 "warmup.epochs=40", "warmup.batch_size=1", "warmup.lr=0.03", "warmup.freeze_embeddings=false",
                 "warmup.decision_weight=1",  # local_cpu's 8 warms this one demonstration up into another policy
                 "rollout.max_turns=1", "policy.prompt_template=bridge_ray/agent/templates/zero_shot.txt",
                 "algorithm.grpo.rollouts_per_question=4"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BRIDGE_RAY_CACHE", str(module_dir / "cache"))  # the warm-up of the tiny policy goes here
        yield module_dir, overrides
