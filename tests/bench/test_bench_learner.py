"""bench learner on a tiny Qwen 2 architecture on the CPU: every variant steps, and the figures add up."""

import json

import pytest

from bridge_ray.bench.learner import MODELS, architecture_config
from bridge_ray.cli import main

TINY_QWEN2 = {
    "model_type": "qwen2", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": True,
}


def test_every_variant_reports_its_rate_and_lora_trains_a_sliver(tmp_path):
    config, out = tmp_path / "tiny-qwen2.json", tmp_path / "learner.json"
    config.write_text(json.dumps(TINY_QWEN2))
    assert main(["bench", "learner", "--model", str(config), "--device", "cpu", "--rows", "2", "--length", "16",
                 "--steps", "1", "--untimed", "0", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["device"] == "cpu" and figures["dtype"] == "float32" and figures["matmul_tflops"] > 0
    assert figures["peak_source"] == "measured matmul" and figures["peak_tflops"] == figures["matmul_tflops"]
    # tied head: every parameter but the norms' enters a matmul once; the embedding is the head
    assert figures["matmul_parameters"] == figures["parameters"]
    for variant in ("full", "full_ckpt", "lora", "lora_ckpt"):
        f = figures[variant]
        assert f["rows"] == 2 and f["tokens_per_step"] == 32 and f["tokens_per_s"] > 0
        # 6N per token for a full step; 4N with LoRA, N then counting the LoRA factors too
        lora = variant.startswith("lora")
        n = figures["matmul_parameters"] + (f["trained_parameters"] if lora else 0)
        assert f["flops_per_token"] == (4 if lora else 6) * n
        assert f["model_tflops"] == pytest.approx(f["flops_per_token"] * f["tokens_per_s"] / 1e12)
        assert f["mfu"] == pytest.approx(f["model_tflops"] / figures["peak_tflops"])
    assert figures["full"]["trained_parameters"] == figures["parameters"]
    assert 0 < figures["lora"]["trained_parameters"] < figures["parameters"]


@pytest.mark.parametrize(("name", "billions"), [("qwen2.5-3b", 3.09), ("qwen2.5-7b", 7.62)])
def test_the_shipped_architectures_have_their_published_sizes(name, billions):
    import torch
    from transformers import AutoModelForCausalLM

    assert (MODELS / f"{name}.json").is_file()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(architecture_config(name))
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.01)


def test_unknown_variants_and_models_are_refused(tmp_path, capsys):
    assert main(["bench", "learner", "--variants", "full,zero3", "--out", str(tmp_path / "x.json")]) == 2
    assert "argument --variants: unknown zero3; choose from full, full_ckpt, lora, lora_ckpt" in capsys.readouterr().err
    out = str(tmp_path / "x.json")
    assert main(["bench", "learner", "--model", "llama-9000", "--device", "cpu", "--out", out]) == 2
    assert "error: --model llama-9000: no architecture config" in capsys.readouterr().err
