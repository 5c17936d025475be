"""The checks that need no model and no Ray, run before Ray starts by ``train`` (and all that ``--dry-run`` checks
besides the resources), ``eval`` and ``serve-retriever``: what a run would otherwise find only inside an actor,
minutes (or, on a cluster, an hour of model loading) later.

Every configured path exists and is what it should be; every question file parses with the run's own loader and
holds questions, the training files (each listed once) at least one batch; the warm-up's demonstration file
parses; the index was built with the configured encoder, and a passage encoder that is to build one loads; a
retriever adapter belongs to that encoder; a resumed checkpoint is of the same policy and encoder; the W&B key is
there when W&B is online; vLLM is there when the samplers use it (a warning). Independent checks all run and every
problem is reported at once (:class:`~bridge_ray.errors.Problems`), each with what fixes it.
"""

from __future__ import annotations

import importlib.util
import json
import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

import yaml
from huggingface_hub import try_to_load_from_cache

from bridge_ray.checkpoint import CONFIG, POLICY_DIR
from bridge_ray.config import Config, ConfigError, EncoderConfig, IndexConfig, LoraConfig, derive
from bridge_ray.config.encoders import EncoderSpec, both_sides
from bridge_ray.coordinator.inputs import train_questions_files
from bridge_ray.data.demonstrations import check_gold_searches, read_demonstrations
from bridge_ray.data.qa import DataError, QuestionRecord, check_unique_uids, load_questions
from bridge_ray.errors import InputError, Problems
from bridge_ray.model_paths import PACKAGED_GEMMA, resolve_model_path
from bridge_ray.retrieval.build import INDEX_PARAMS
from bridge_ray.retrieval.manifest import IndexManifest, encoder_fix, load_index_manifest, read_manifest

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# The architecture fields of an HF config.json by which two models are told apart without loading either.
ARCHITECTURE = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")


def _existing(path: str, key: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{key}: {path} does not exist")
    return p


def _questions(path: str, key: str, problems: Problems) -> list[QuestionRecord]:
    """The questions of one file, or [] with its problem recorded: missing, malformed (file:line) or empty."""
    with problems.check():
        if not Path(path).is_file():
            raise ConfigError(f"{key}: {path} is not a file")
        questions = load_questions([path])
        if not questions:
            raise ConfigError(f"{key}: {path} holds no questions; point {key} at a question file "
                              "(bridge-ray prepare-data writes them)")
        return questions
    return []


def _question_files(config: Config, problems: Problems) -> str:
    """Load every question file as the run will (train as one mixture, eval set by set); the training set must
    fill one round's batch (``QuestionCursor`` refuses less, after every model has loaded)."""
    data, rollout = config.data, config.rollout
    keys, train_files = _train_files(config)
    loaded = [_questions(path, key, problems) for key, path in zip(keys, train_files, strict=True)]
    _one_mixture(train_files, keys, loaded, problems)
    if config.warmup.enabled and all(loaded):
        with problems.check():
            check_gold_warmup(config, [question for questions in loaded for question in questions])
    found = [len(questions) for questions in loaded]
    total, drawn = sum(found), rollout.questions_drawn
    if all(found) and total < drawn:
        per_round = f"rollout.questions_per_batch={rollout.questions_per_batch}"
        if drawn > rollout.questions_per_batch:
            per_round += f" x rollout.oversample={rollout.oversample:g} = {drawn} questions a round"
        fits = max(1, int(total / rollout.oversample))
        problems.found.append(
            f"{'data.train' if data.train else 'data.world'}: {total} training questions, fewer than one batch "
            f"({per_round}); add question files to data.train, or pass rollout.questions_per_batch={fits}"
        )
    evals = [f"{name} {path} ({len(_questions(path, f'data.eval.{name}', problems))} questions)"
             for name, path in data.eval.items()]
    world = bundled_world(data.world)
    train = f"{data.train} ({total} questions)" if data.train else f"{world} ({total} questions)"
    others = [f"{bundled_world(other)} (eval.worlds)" for other in config.eval.worlds]
    return f"data: train {train}; eval {', '.join([*evals, *others] if evals else [world, *others])}"


def _train_files(config: Config) -> tuple[list[str], list[str]]:
    """The training question files and the key that names each in messages."""
    return [f"data.train[{i}]" for i in range(len(config.data.train))] or ["data.world"], train_questions_files(config)


def _one_mixture(files: list[str], keys: list[str], loaded: list[list[QuestionRecord]], problems: Problems) -> None:
    """The training files are read as one mixture, whose question ids must be unique (:func:`load_questions`
    refuses it otherwise, inside Ray): each file listed once, no id in two of them."""
    first: dict[Path, str] = {}
    for key, path in zip(keys, files, strict=True):
        if (earlier := first.setdefault(Path(path).resolve(), key)) != key:
            problems.found.append(f"{key}: {path} is {earlier} again; list each file once")
    if len(first) == len(files) and all(loaded):
        with problems.check():
            try:
                check_unique_uids([question for questions in loaded for question in questions])
            except DataError as exc:
                raise ConfigError(f"data.train: {exc}: a uid is <folder>/<file name>/<id>, so rename one of the "
                                  "files or give their questions other ids") from None


def check_warmup_data(config: Config) -> None:
    """``warmup.data``'s records, read as the warm-up reads them (without a tokenizer), when the warm-up runs."""
    if config.warmup.enabled and config.warmup.data is not None:
        try:
            read_demonstrations(config.warmup.data)
        except DataError as exc:
            raise ConfigError(f"warmup.data: {exc}") from None


def check_gold_warmup(config: Config, train: list[QuestionRecord]) -> None:
    """A warm-up without ``warmup.data`` builds its demonstrations from the training questions' gold passages
    (:func:`~bridge_ray.agent.demonstrations.gold_search_demonstrations`): they must name some, as corpus ids."""
    if config.warmup.data is None:
        try:
            check_gold_searches(train)
        except DataError as exc:
            raise ConfigError(f"warmup: {exc}; give warmup.data a demonstration file, or set warmup.enabled=false"
                              ) from None


def warmup_preflight(config: Config) -> None:
    """``warmup``'s checks before the policy loads (the command warms up whatever ``warmup.enabled`` says): the
    demonstration file, else the training questions and their gold passages; every problem at once."""
    config = derive(config, {"warmup.enabled": True}, source="warmup")
    problems = Problems()
    with problems.check():
        check_warmup_data(config)
    if config.warmup.data is None:
        loaded = [_questions(path, key, problems) for key, path in zip(*_train_files(config), strict=True)]
        if all(loaded):
            with problems.check():
                check_gold_warmup(config, [question for questions in loaded for question in questions])
    problems.raise_any()


def bundled_world(kind: str) -> str:
    """How the lines name a bundled world (``data.world``)."""
    return "the bundled world" if kind == "default" else f"the bundled {kind} world"


def check_index(config: Config, key: str = "retrieval.index.dir") -> tuple[str, IndexManifest | None]:
    """The line for ``retrieval.index.dir`` and its manifest (None for the bundled world's, built in the cache
    with the configured encoder): complete, every file of its size, built with ``retrieval.encoder``."""
    index = config.retrieval.index
    if index.dir is None:
        return f"index: {bundled_world(config.data.world)}'s, built into the cache on first use", None
    _existing(index.dir, key)
    manifest = read_manifest(index.dir)
    spec = config.retrieval.encoder.spec()
    if mismatches := spec.index_mismatches(manifest.encoder):
        raise ConfigError(
            f"{key}: {index.dir} was built with another encoder than retrieval.encoder ({'; '.join(mismatches)}); "
            + encoder_fix(manifest, spec, index.dir)
        )
    load_index_manifest(index.dir, verify="never")  # every file there, of its recorded size (a stat each)
    if differ := build_key_mismatches(index, manifest.build):
        raise ConfigError(f"{key}: {index.dir} was built otherwise than retrieval.index says ({'; '.join(differ)}): "
                          "a prebuilt index is searched as it was built, so leave these keys out, or rebuild it "
                          "with them (build-index)")
    shards = len(manifest.shards)
    query_config = model_config(spec.model) or {}
    if query_config.get("hidden_size", manifest.dim) != manifest.dim:
        raise ConfigError(f"{key}: {index.dir} holds vectors of dimension {manifest.dim}, the query encoder "
                          f"{spec.model} has hidden size {query_config['hidden_size']}: a pair's two encoders must "
                          "embed into one space (retrieval.encoder.name, retrieval.encoder.passage_name)")
    encoder = " + ".join(dict.fromkeys(both_sides(manifest.encoder)[k] for k in ("model", "passage_model")))
    return (f"index: {index.dir} ({manifest.num_passages} passages, {shards} shard(s), one shard holder each; "
            f"encoder {encoder})"), manifest


def build_key_mismatches(index: IndexConfig, build: dict) -> list[str]:
    """The build-only ``retrieval.index`` keys the config sets that differ from what a prebuilt index's manifest
    (``build``) records; a key of another index type than the one built (``hnsw_m`` beside a flat index) differs."""
    params = build.get("index_params") or {}
    built = {"num_shards": build.get("num_shards"), "index_type": build.get("index_type")}
    built |= {key: params.get(param) for keys in INDEX_PARAMS.values() for key, param in keys.items()}
    return [f"retrieval.index.{k} {v!r}, the index {built[k]!r}" for k, v in index.build_keys_set().items()
            if built[k] != v]


def model_config(name: str) -> dict | None:
    """The ``config.json`` of model ``name`` (a packaged one, a local directory or a hub id in the local Hugging
    Face cache) without loading it; None when it is not on this machine (a hub id to download)."""
    if name == PACKAGED_GEMMA:
        return None  # converted on first use: its config is not on disk before
    path = Path(resolve_model_path(name))
    if path.is_dir():
        file = path / "config.json"
    else:
        try:
            cached = try_to_load_from_cache(name, "config.json") if _looks_like_hub_id(name) else None
        except ValueError:  # not a valid repo id: from_pretrained will say so
            cached = None
        file = Path(cached) if isinstance(cached, str) else None
    if file is None or not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{file}: unreadable model config ({exc}); the model folder is damaged") from None


def _looks_like_hub_id(name: str) -> bool:
    return not name.startswith((".", "/", "~")) and name.count("/") <= 1


def check_model_source(name: str, key: str, here: bool) -> str | None:
    """``name`` loads from somewhere: a model directory, or a hub id that is cached or may be downloaded.

    A hub id missing from this machine's cache while ``HF_HUB_OFFLINE`` is set is an error when the model loads
    ``here`` (``eval``, ``serve-retriever``); for a Ray run it is returned as a warning, since the nodes that load
    it have caches of their own.
    """
    if name == PACKAGED_GEMMA:
        return None
    try:
        path = resolve_model_path(name)
    except FileNotFoundError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    if Path(path).exists() or not _looks_like_hub_id(name):
        if not (_existing(path, key) / "config.json").is_file():
            raise ConfigError(f"{key}: {name} is not a Hugging Face model directory (no config.json)")
        return None
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("0", "", "false", "no") or model_config(name) is not None:
        return None
    problem = (f"{key}: {name} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; download it first "
               f"(huggingface-cli download {name}) or point {key} at a local copy")
    if here:
        raise ConfigError(problem)
    return f"warning: {problem} (unless the nodes that load it have it in their own caches)"


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors file's header, its length checked against the header's offsets."""
    damaged = f"{path}: not a whole safetensors file"
    try:
        with path.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if not 0 < length <= path.stat().st_size - 8:
                raise InputError(f"{damaged} (header length {length})")
            header = json.loads(f.read(length))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{damaged} (header: {exc})") from None
    tensors = {name: t for name, t in header.items() if name != "__metadata__"}
    end = max((t["data_offsets"][1] for t in tensors.values()), default=0)
    if path.stat().st_size != 8 + length + end:
        raise InputError(f"{damaged}: {path.stat().st_size} bytes, its header says {8 + length + end}")
    return {name: t["shape"] for name, t in tensors.items()}


def check_adapter(adapter: str | Path, spec: EncoderSpec, key: str) -> dict:
    """``adapter`` is a whole peft adapter of ``spec``'s encoder: its config parses, its tensors are all there, its
    base model is the encoder's and its LoRA factors fit the encoder's widths. Returns its parsed config."""
    directory = Path(adapter)
    missing = [name for name in ADAPTER_FILES if not (directory / name).is_file()]
    if missing:
        raise InputError(f"{key} {adapter}: not a peft adapter directory (no {', '.join(missing)})")
    damaged = "the adapter is damaged: take it again from the checkpoint that wrote it (its retriever_adapter/)"
    try:
        config = json.loads((directory / ADAPTER_FILES[0]).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{key} {directory / ADAPTER_FILES[0]}: invalid JSON ({exc}); {damaged}") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise InputError(f"{key} {directory / ADAPTER_FILES[0]}: not a peft LoRA config; {damaged}")
    try:
        shapes = _safetensors_shapes(directory / ADAPTER_FILES[1])
    except InputError as exc:
        raise InputError(f"{key} {exc}; {damaged}") from None
    fix = (f"use an adapter trained with retrieval.encoder.name={spec.model}, or set retrieval.encoder to the "
           "adapter's encoder")
    base, encoder = str(config.get("base_model_name_or_path") or ""), model_config(spec.model) or {}
    if base and base not in (spec.model, resolve_model_path(spec.model)):
        base_config = model_config(base) if Path(base).is_dir() or _looks_like_hub_id(base) else None
        differs = [f for f in ARCHITECTURE if base_config and encoder and base_config.get(f) != encoder.get(f)]
        if differs or (base_config is None and _looks_like_hub_id(base) and not Path(base).exists()):
            raise InputError(f"{key} {adapter}: an adapter of {base}, the encoder is {spec.model}; {fix}")
    widths = {shape[-1] for name, shape in shapes.items() if "lora_A" in name}
    widths |= {shape[0] for name, shape in shapes.items() if "lora_B" in name}
    known = {encoder.get("hidden_size"), encoder.get("intermediate_size")} - {None}
    if known and not widths <= known:
        raise InputError(f"{key} {adapter}: its LoRA factors act on widths {sorted(widths)}, the encoder "
                         f"{spec.model} has hidden size {encoder.get('hidden_size')}; {fix}")
    return config


def check_wandb(config: Config) -> None:
    """``telemetry.wandb_mode: online`` needs a W&B key; without one ``wandb.init`` fails after every model loaded."""
    if config.telemetry.wandb_mode != "online" or os.environ.get("WANDB_API_KEY"):
        return
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        if netrc.netrc().authenticators(host or "api.wandb.ai"):
            return
    except (FileNotFoundError, netrc.NetrcParseError):
        pass
    raise ConfigError(f"telemetry.wandb_mode: online, but no W&B key (no WANDB_API_KEY, no ~/.netrc entry for "
                      f"{host}): run `wandb login` or export WANDB_API_KEY, or pass telemetry.wandb_mode=offline")


def check_engine(config: Config) -> str | None:
    """``engine.backend: vllm`` needs vLLM wherever the samplers run: a warning when this environment lacks it (a
    local run would fail in every sampler on import; a cluster's image may have it)."""
    if config.engine.backend != "vllm" or importlib.util.find_spec("vllm") is not None:
        return None
    return ("warning: engine.backend: vllm, but vLLM is not installed here: a local run's samplers would fail; "
            "pass engine.backend=hf, or install it (on a CPU: make install "
            "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu; on a GPU: make install-gpu)")


def check_same_run(checkpoint: Path, config: Config, flag: str) -> None:
    """A resumed checkpoint was trained with this config's policy and retriever encoder (its ``config.yaml``)."""
    saved_file = checkpoint / CONFIG
    if not saved_file.is_file():
        return
    try:
        saved = yaml.safe_load(saved_file.read_text())
        model, encoder = saved["policy"]["model"], saved["retrieval"]["encoder"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise InputError(f"{flag}: {saved_file}: unreadable ({exc!r}); the checkpoint is damaged") from None
    new_run = "or start a new run (another run.output_dir)"
    try:
        trained_with = EncoderConfig.model_validate({**encoder, "adapter": None}).spec().to_dict()
    except ValueError:  # the config of an older release: its encoder's name is what can be compared
        trained_with = {"model": encoder.get("name")}
    spec = config.retrieval.encoder.spec().to_dict()  # passage_model: a pair's only
    compared = [k for k in EncoderSpec.INDEX_FIELDS if k in trained_with or k == "passage_model"]
    if differ := [f"{k}: checkpoint {trained_with.get(k)!r}, config {spec.get(k)!r}"
                  for k in compared if trained_with.get(k) != spec.get(k)]:
        raise InputError(f"{flag}: {checkpoint} was trained with another retriever encoder ({'; '.join(differ)}); "
                         f"resume with its encoder (retrieval.encoder.name={trained_with['model']}), {new_run}")
    # With the warm-up on, the checkpoint's policy.model is the warmed-up copy in the cache: the architectures
    # below are compared instead.
    if model != config.policy.model and not config.warmup.enabled:
        raise InputError(f"{flag}: {checkpoint} was trained from policy.model={model}, the config says "
                         f"{config.policy.model}; resume with policy.model={model}, {new_run}")
    trained, configured = model_config(str(checkpoint / POLICY_DIR)), model_config(config.policy.model)
    if trained and configured and (differ := [f for f in ARCHITECTURE if trained.get(f) != configured.get(f)]):
        raise InputError(f"{flag}: {checkpoint}'s policy is another model than policy.model={config.policy.model} "
                         f"({', '.join(differ)} differ); {new_run}")
    if differ := adapter_differences(saved, config):
        raise InputError(f"{flag}: {checkpoint} was trained with other adapters ({'; '.join(differ)}): its optimizer "
                         f"state holds those parameters; resume with the checkpoint's values, {new_run}")


# The adapter settings that shape a checkpoint's parameters and optimizer state (alpha scales them).
ADAPTER_KEYS = {"learner.lora": ("enabled", "rank", "alpha", "target_modules"),
                "retrieval.lora": ("rank", "alpha", "target_modules")}


def adapter_differences(saved: dict, config: Config) -> list[str]:
    """``key: checkpoint X, config Y`` for each adapter setting of :data:`ADAPTER_KEYS` where a saved config (a
    checkpoint's ``config.yaml``, as loaded) and ``config`` differ; a policy LoRA that is off on both sides is not
    compared (its rank and targets shape nothing)."""
    configured = config.model_dump()
    differ = []
    for section, keys in ADAPTER_KEYS.items():
        outer, inner = section.split(".")
        was, now = (saved.get(outer) or {}).get(inner) or {}, configured[outer][inner]
        if section == "learner.lora" and not (was.get("enabled") or now["enabled"]):
            continue
        differ += [f"{section}.{key}: checkpoint {was.get(key)!r}, config {now[key]!r}"
                   for key in keys if key in was and was[key] != now[key]]
    return differ


def _retrieval(
    config: Config,
    problems: Problems,
    adapter: str | Path | None,
    adapter_key: str,
    here: bool,
    index_key: str = "retrieval.index.dir",
) -> list[str]:
    """The index, the encoder and the adapter a run retrieves with (``here``: loaded in this process, not in
    actors): the index line and any warning."""
    lines = []
    with problems.check():
        lines.append(check_index(config, index_key)[0])
    encoder = config.retrieval.encoder
    with problems.check():
        lines.append(check_model_source(encoder.name, "retrieval.encoder.name", here))
    if encoder.passage_name is not None and config.retrieval.index.dir is None:  # it builds the bundled world's
        with problems.check():
            lines.append(check_model_source(encoder.passage_name, "retrieval.encoder.passage_name", here))
    if adapter is not None:
        with problems.check():
            saved = check_adapter(adapter, encoder.spec(), adapter_key)
            if adapter_key == "retrieval.encoder.adapter" and config.algorithm.train_retriever:  # trained as saved
                check_adapter_shape(adapter, saved, config.retrieval.lora, adapter_key)
    return [line for line in lines if line]


def check_adapter_shape(adapter: str | Path, saved: dict, lora: LoraConfig, key: str) -> None:
    """A starting adapter is trained as it was saved (its ``adapter_config.json``, ``saved``, decides rank, alpha,
    dropout and targets), so ``retrieval.lora`` must say the same, or it would be accepted and ignored. Targets are
    compared when ``retrieval.lora.target_modules`` is set (null: the architecture's default, which the adapter may
    hold)."""
    pairs = [("rank", lora.rank, saved.get("r")), ("alpha", lora.alpha, saved.get("lora_alpha")),
             ("dropout", lora.dropout, saved.get("lora_dropout"))]
    if lora.target_modules is not None:
        pairs.append(("target_modules", sorted(lora.target_modules), sorted(saved.get("target_modules") or [])))
    differ = [f"retrieval.lora.{name}: config {ours!r}, adapter {theirs!r}" for name, ours, theirs in pairs
              if theirs is not None and ours != theirs]
    if differ:
        raise InputError(f"{key} {adapter} is trained as saved, and {'; '.join(differ)}: set retrieval.lora to the "
                         "adapter's values")


def preflight(config: Config) -> list[str]:
    """Run every check of a training run's inputs; raise one :class:`~bridge_ray.errors.InputErrors` listing every
    problem, else return one line per checked input (and a warning per model that may not load)."""
    problems = Problems()
    lines = [_question_files(config, problems)]
    lines += _retrieval(config, problems, config.retrieval.encoder.adapter, "retrieval.encoder.adapter", here=False)
    model = config.policy.model
    with problems.check():
        lines.append(check_model_source(model, "policy.model", here=False))
    lines.append(f"policy: {model} ({config.engine.backend} samplers, ZeRO-{config.learner.zero_stage} learner)")
    with problems.check():
        check_warmup_data(config)
    with problems.check():
        check_wandb(config)
    lines.append(check_engine(config))
    problems.raise_any()
    return [line for line in lines if line]


def eval_preflight(config: Config, files: dict[str, str], policy: str | None, adapter: Path | None) -> None:
    """``eval``'s checks before its model loads: the question ``files`` (name -> path), the index, the encoder, the
    checkpoint's retriever ``adapter`` (else ``retrieval.encoder.adapter``) and the policy (``policy``, a
    checkpoint's, else ``policy.model``); every problem at once."""
    problems = Problems()
    for name, path in files.items():
        _questions(path, f"data.eval.{name}", problems)
    key = "--checkpoint" if adapter is not None else "retrieval.encoder.adapter"
    _retrieval(config, problems, adapter or config.retrieval.encoder.adapter, key, here=True)
    if policy is None:
        with problems.check():
            check_model_source(config.policy.model, "policy.model", here=True)
    problems.raise_any()


def serve_preflight(config: Config, adapter: str | None) -> None:
    """``serve-retriever``'s checks before the encoder loads: the index (``--index``), the encoder it was built
    with, the ``--adapter``; every problem at once."""
    problems = Problems()
    _retrieval(config, problems, adapter, "--adapter", here=True, index_key="--index")
    problems.raise_any()
