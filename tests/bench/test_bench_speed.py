"""bench speed's reference side: the plain settings the defaults replaced."""

from bridge_ray.bench.speed import reference_settings


def test_the_reference_fine_tunes_the_whole_policy_unless_asked_to_keep_the_configs():
    from bridge_ray.config import load_config

    for policy, lora, lr, kl, old_logp in (("full", False, 1e-5, 1e-4, "learner"),
                                           ("config", True, 2e-4, 0.0, "sampler")):
        config = load_config("jobs/configs/local_cpu.yaml", list(reference_settings(policy)))
        grpo = config.algorithm.grpo
        assert (config.learner.lora.enabled, config.optim.lr, config.learner.dtype) == (lora, lr, "float32")
        assert (grpo.kl_coef, grpo.old_logp) == (kl, old_logp)
        assert not config.engine.hf.prefix_cache, "the reference encodes each turn's prompt whole"
        assert not config.engine.hf.merge_adapter, "and serves a LoRA policy's adapter through peft"
    gap = load_config("jobs/configs/local_cpu_gap.yaml", list(reference_settings("config")))
    assert gap.learner.lora.enabled and gap.optim.lr == 5e-5, "the gap world's policy only fits as LoRA"
