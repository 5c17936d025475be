"""Bad configuration input: each case feeds the real text to ``load_config`` (or the CLI) and checks that the
message names the culprit (file:line, key or override)."""

import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from bridge_ray.cli import main
from bridge_ray.config import Config, ConfigError, dump_config, load_config

REPO = Path(__file__).resolve().parents[2]
LOCAL_CPU = REPO / "jobs" / "configs" / "local_cpu.yaml"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def float_keys(model: type[BaseModel] = Config, prefix: tuple[str, ...] = ()) -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += float_keys(annotation, (*prefix, name))
        elif typing.get_origin(annotation) is dict and typing.get_args(annotation)[1] is float:
            keys.append(".".join((*prefix, name, "pool")))  # a mapping's float values: one entry, named pool
        elif float in (annotation, *typing.get_args(annotation)):
            keys.append(".".join((*prefix, name)))
    return keys


# 1. exponent floats


@pytest.mark.parametrize(("text", "value"), [("1e-5", 1e-5), ("1E-5", 1e-5), (".5e-3", 5e-4), ("2.5e-3", 2.5e-3)])
def test_exponent_floats_in_overrides_and_files(tmp_path, text, value):
    assert load_config(None, [f"optim.lr={text}"]).optim.lr == value
    cfg = load_config(write(tmp_path / "cfg.yaml", f"optim:\n  lr: {text}\nrun:\n  call_timeout_s: 1E3\n"))
    assert (cfg.optim.lr, cfg.run.call_timeout_s) == (value, 1000.0)


def test_exponent_floats_leave_strings_alone(tmp_path):
    cfg = load_config(None, ["telemetry.wandb_project='1e5'", "run.output_dir=runs/1e-5", "policy.model=e5-base"])
    assert (cfg.telemetry.wandb_project, cfg.run.output_dir, cfg.policy.model) == ("1e5", "runs/1e-5", "e5-base")
    with pytest.raises(ConfigError, match=r"optim\.lr: .*valid number.*cfg\.yaml:2"):
        load_config(write(tmp_path / "cfg.yaml", "optim:\n  lr: '1e-5'\n"))  # quoted: a string, as before
    with pytest.raises(ConfigError, match=r"run\.rounds: .*valid integer \[override 'run\.rounds=1e3'\]"):
        load_config(None, ["run.rounds=1e3"])
    assert yaml.safe_load("1e-5") == "1e-5", "PyYAML's own loader is left as it is"


# 2. non-finite floats

FINITE_KEYS = [key for key in float_keys() if key != "algorithm.retriever.gamma"]


def test_every_float_key_is_found():
    assert {"optim.lr", "algorithm.grpo.clip_high", "algorithm.grpo.kl_coef", "roles.policy_learner.cpus"} <= set(
        FINITE_KEYS
    )


@pytest.mark.parametrize("key", FINITE_KEYS)
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_floats_are_rejected(key, value):
    mapping = key.removesuffix(".pool")
    override = f"{mapping}={{pool: {value}}}" if mapping != key else f"{key}={value}"
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert f"{key}: Input should be a finite number [override '{override}']" in str(err.value)


def test_non_finite_float_in_a_file_names_the_line(tmp_path):
    path = write(tmp_path / "cfg.yaml", "optim:\n  grad_clip: 1.0\n  lr: .inf\n")
    with pytest.raises(ConfigError, match=rf"optim\.lr: Input should be a finite number \[{path}:3\]"):
        load_config(path)


def test_infinite_gamma_still_means_rag_only():
    assert load_config(None, ["algorithm.retriever.gamma=.inf"]).algorithm.retriever.gamma == float("inf")
    with pytest.raises(ConfigError, match=r"retriever\.gamma: .*override 'algorithm\.retriever\.gamma=\.nan'"):
        load_config(None, ["algorithm.retriever.gamma=.nan"])


# 3. duplicate keys


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("run:\n  rounds: 3\noptim:\n  lr: 1.0e-5\nrun:\n  seed: 1\n", r"cfg\.yaml:5: .*key 'run' \(first on line 1\)"),
        ("algorithm:\n  grpo:\n    kl_coef: 0.1\n    kl_coef: 0.2\n", r"cfg\.yaml:4: .*'kl_coef' \(first on line 3\)"),
    ],
)
def test_duplicate_keys_name_file_and_both_lines(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path / "cfg.yaml", text))


def test_duplicate_keys_in_an_override():
    with pytest.raises(ConfigError, match=r"override 'data\.eval=\{a: x\.jsonl, a: y\.jsonl\}'.*duplicate key 'a'"):
        load_config(None, ["data.eval={a: x.jsonl, a: y.jsonl}"])


# 4. errors name the override or the line, never [defaults] for a value the user gave


@pytest.mark.parametrize(
    ("overrides", "culprits"),
    [
        (["rollout.max_action_length=99999"], ["override 'rollout.max_action_length=99999'"]),
        (["rollout.max_response_length=100"], ["override 'rollout.max_response_length=100'"]),
        (["rollout={max_action_length: 99999}"], ["override 'rollout={max_action_length: 99999}'"]),
        (["optim.mini_batch_size=100"], ["override 'optim.mini_batch_size=100'"]),
        (["engine.vllm.max_model_len=10"], ["override 'engine.vllm.max_model_len=10'"]),
        (
            ["engine.backend=vllm", "learner.lora.enabled=true", "engine.vllm.enable_lora=false"],
            ["needs engine.vllm.enable_lora true or null", "override 'engine.vllm.enable_lora=false'"],
        ),
        (
            ["engine.backend=vllm", "learner.lora.enabled=true", "engine.vllm.enable_lora=true",
             "learner.lora.rank=32"],
            ["max_lora_rank (16) must be >= learner.lora.rank (32)", "override 'learner.lora.rank=32'"],
        ),
        (
            ["algorithm.estimator=two_state", "algorithm.train_retriever=false"],
            ["override 'algorithm.estimator=two_state'", "override 'algorithm.train_retriever=false'"],
        ),
        (
            ["algorithm.estimator=two_state", "algorithm.retriever.kl_coef=3"],
            ["η* on L_RAG alone", "inherit algorithm.retriever.kl_coef: 3.0;",
             "override 'algorithm.retriever.kl_coef=3'"],
        ),
    ],
)
def test_cross_field_errors_name_the_override(overrides, culprits):
    with pytest.raises(ConfigError) as err:
        load_config(None, [*overrides, "run.seed=3"])
    msg = str(err.value)
    assert all(c in msg for c in culprits) and "[defaults]" not in msg and "run.seed" not in msg


def test_cross_field_errors_name_file_lines_and_overrides(tmp_path):
    text = "run:\n  seed: 1\nrollout:\n  questions_per_batch: 6\n  max_action_length: 10\n"
    path = write(tmp_path / "cfg.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_config(path, ["optim.mini_batch_size=4"])
    assert f"[override 'optim.mini_batch_size=4', {path}:4]" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(path, ["rollout.max_action_length=99999"])  # the override replaced line 5
    assert str(err.value).endswith("[override 'rollout.max_action_length=99999']")
    with pytest.raises(ConfigError, match=rf"max_response_length \(100\) \[{path}:2\]"):
        load_config(write(path, "rollout:\n  max_response_length: 100\n"))


def test_cli_names_the_override(capsys):
    assert main(["config", "rollout.max_action_length=99999"]) == 2
    assert "[override 'rollout.max_action_length=99999']" in capsys.readouterr().err


# 5. paths in a config file are relative to it; on the command line, to the current directory


def test_preset_loads_from_another_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    template = Path(load_config(LOCAL_CPU).policy.prompt_template)
    assert template == REPO / "bridge_ray" / "agent" / "templates" / "zero_shot.txt" and template.is_file()
    assert main(["config", "--config", str(LOCAL_CPU)]) == 0
    assert f"prompt_template: {template}" in capsys.readouterr().out
    override = load_config(None, ["policy.prompt_template=bridge_ray/agent/templates/few_shot.txt"])
    assert override.policy.prompt_template == str(template.parent / "few_shot.txt"), "the package's, from any cwd"


def test_cluster_presets_keep_meaning_the_checkouts_data():
    cfg = load_config(REPO / "jobs" / "configs" / "qwen2.5-3b-bridge.yaml")
    assert cfg.data.train == [str(REPO / "data" / "nq_hotpotqa_train.parquet")]
    assert cfg.data.eval["nq"] == str(REPO / "data" / "nq_test.jsonl")
    assert cfg.retrieval.index.dir == str(REPO / "indexes" / "wiki18-e5-flat")


def test_file_paths_resolve_against_the_file_and_overrides_against_the_cwd(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    for name in ("t.txt", "demos.jsonl", "sub/q.jsonl"):
        write(conf / name, "")
    write(tmp_path / "work" / "other.txt", "")
    path = write(
        conf / "cfg.yaml",
        "policy:\n  prompt_template: t.txt\nwarmup:\n  data: ./demos.jsonl\n"
        "data:\n  train: [sub/q.jsonl]\n  eval: {a: sub/q.jsonl, b: /abs/b.jsonl}\n"
        "retrieval:\n  index:\n    dir: ../index\nrun:\n  output_dir: runs/x\n",
    )
    monkeypatch.chdir(tmp_path / "work")
    cfg = load_config(path)
    assert (cfg.policy.prompt_template, cfg.warmup.data) == (str(conf / "t.txt"), str(conf / "demos.jsonl"))
    assert cfg.data.train == [str(conf / "sub" / "q.jsonl")]
    assert cfg.data.eval == {"a": str(conf / "sub" / "q.jsonl"), "b": "/abs/b.jsonl"}
    assert cfg.retrieval.index.dir == str(tmp_path / "index") and cfg.run.output_dir == "runs/x"  # output: the cwd's
    cfg = load_config(path, ["policy.prompt_template=other.txt", "data.eval.c=c.jsonl"])
    assert cfg.policy.prompt_template == str(tmp_path / "work" / "other.txt")
    assert cfg.data.eval["c"] == str(tmp_path / "work" / "c.jsonl") and cfg.data.eval["b"] == "/abs/b.jsonl"
    monkeypatch.chdir(tmp_path)
    assert load_config(write(tmp_path / "dump" / "config.yaml", dump_config(cfg))) == cfg, "a dump loads anywhere"


def test_missing_relative_path_names_where_it_looked(tmp_path, monkeypatch):
    path = write(tmp_path / "conf" / "cfg.yaml", "policy:\n  prompt_template: nope.txt\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"'{tmp_path / 'conf' / 'nope.txt'}' does not exist \[{path}:2\]"):
        load_config(path)
