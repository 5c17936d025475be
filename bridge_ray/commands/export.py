"""``bridge-ray export``: a checkpoint's models as folders that Search-R1, FlashRAG and vLLM load as they are.

``OUT/retriever`` is the query encoder with the trained LoRA merged in (``bridge_ray.retrieval.export``);
``OUT/policy`` is the checkpoint's HF policy, completed with what ``vllm serve`` needs and a checkpoint may
lack (a tokenizer, a generation config); ``OUT/README.md`` says how to serve both and is also printed. The
export is written into a folder beside ``--out`` and renamed into place, so ``--out`` never holds half an
export; a non-empty ``--out`` is replaced only under ``--overwrite``, and only once the new export is whole.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import uuid
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from bridge_ray import __version__
from bridge_ray.agent.prompt import PromptTemplate
from bridge_ray.agent.protocol import INFO_CLOSE, INFO_OPEN, STOP_STRINGS
from bridge_ray.checkpoint import CONFIG, POLICY_DIR, Manifest, find_checkpoint, retriever_adapter_dir
from bridge_ray.cli import add_out_argument
from bridge_ray.config import Config, load_config
from bridge_ray.engines.models import load_tokenizer
from bridge_ray.errors import InputError
from bridge_ray.model_paths import resolve_model_path, save_tokenizer
from bridge_ray.retrieval.export import SETTINGS_FILE, caveats, export_retriever, flashrag_config, search_r1_command
from bridge_ray.train.preflight import check_adapter

PARTS = ("retriever", "policy")
EXPORT_FILE, README_FILE, PROMPT_FILE = "export.json", "README.md", "prompt_template.txt"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="a checkpoint directory (or a run's checkpoint root)"
    )
    add_out_argument(parser, "folder", "the export: new or empty (or replaced whole with --overwrite)", required=True,
                     what="an export", marker=EXPORT_FILE, overwrite="replace whatever --out holds")
    parser.add_argument("--what", default=",".join(PARTS), metavar="PARTS", help="comma-separated: retriever, policy")


def run(args: argparse.Namespace) -> int:
    parts = _parts(args.what)
    out = Path(args.out).absolute()
    checkpoint, manifest = find_checkpoint(args.checkpoint)
    policy = checkpoint / POLICY_DIR if "policy" in parts else None
    _check_sources(checkpoint, "retriever" in parts, policy)
    adapter = retriever_adapter_dir(checkpoint) if "retriever" in parts else None
    config = load_config(checkpoint / CONFIG)
    if adapter is not None:
        check_adapter(adapter, config.retrieval.encoder.spec(), "--checkpoint")
    _claim(out, checkpoint)
    print(_export(config, checkpoint, manifest, out, adapter=adapter, policy=policy), end="")
    return 0


def _parts(value: str) -> tuple[str, ...]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names or set(names) - set(PARTS):
        raise InputError(f"--what {value!r}: expected a comma-separated subset of {', '.join(PARTS)}")
    return tuple(name for name in PARTS if name in names)


def _check_sources(checkpoint: Path, retriever: bool, policy: Path | None) -> None:
    """Every part asked for is in the checkpoint (the retriever adapter may be the one a policy-only run started
    from), before anything is written or loaded."""
    adapter = retriever_adapter_dir(checkpoint) if retriever else None
    if retriever and adapter is None:
        raise InputError(f"--checkpoint {checkpoint}: its run retrieved with the base encoder (no retriever adapter "
                         "was trained or given); pass --what policy")
    if adapter is not None and not (adapter / "adapter_config.json").is_file():
        raise InputError(f"--checkpoint {checkpoint}: no retriever adapter in {adapter} (adapter_config.json is "
                         "missing)")
    if policy is not None and not ((policy / "config.json").is_file() and any(policy.glob("*.safetensors"))):
        raise InputError(f"--checkpoint {checkpoint}: {policy} holds no HF model (config.json + *.safetensors)")


def _claim(out: Path, checkpoint: Path) -> None:
    """Refuse an ``--out`` that would take the checkpoint (what it holds is checked with the flag)."""
    source = checkpoint.resolve()
    if out.resolve() in (source, *source.parents) or source in out.resolve().parents:
        raise InputError(f"--out {out}: inside or around the checkpoint {checkpoint}; choose a folder outside it")


def _export(
    config: Config, checkpoint: Path, manifest: Manifest, out: Path, *, adapter: Path | None, policy: Path | None
) -> str:
    """Write the export into a folder beside ``out`` and rename it into place; the README text."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        sections = [f"# Export of {checkpoint.resolve()} (round {manifest.round})\n"]
        if adapter is not None:
            sections.append(_export_retriever(config, adapter, staging, out))
        if policy is not None:
            sections.append(_export_policy(config, policy, staging, out))
        readme = "\n".join(sections)
        (staging / README_FILE).write_text(readme)
        info = {
            "checkpoint": str(checkpoint.resolve()), "round": manifest.round,
            "policy_version": manifest.policy_version, "retriever_version": manifest.retriever_version,
            "parts": [name for name, source in zip(PARTS, (adapter, policy), strict=True) if source is not None],
            "bridge_ray": __version__,
        }
        (staging / EXPORT_FILE).write_text(json.dumps(info, indent=2) + "\n")
        _publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return readme


def _publish(staging: Path, out: Path) -> None:
    """Rename ``staging`` to ``out``; what ``out`` held goes only once the export is in place."""
    if not out.exists():
        staging.rename(out)
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    out.rename(old)
    staging.rename(out)
    shutil.rmtree(old)


def _export_retriever(config: Config, adapter: Path, staging: Path, out: Path) -> str:
    """``retriever/``: the merged query encoder; its README section, with the flags of the servers."""
    spec = config.retrieval.encoder.spec()
    export_retriever(spec, adapter, staging / "retriever")
    final = out / "retriever"
    notes = "".join(f"- {line}\n" for line in caveats(spec))
    prompt = ', prompt_name="query"' if spec.query_prefix else ""
    return (
        "## retriever/: the trained query encoder (LoRA merged), a plain Hugging Face model\n\n"
        f"For queries only: passages keep the base encoder {spec.model}, so search an index built with it.\n"
        f"Pooling {spec.pooling}, normalize {json.dumps(spec.normalize)}, query prefix {spec.query_prefix!r}, "
        f"max_length {spec.max_query_length} (retriever/{SETTINGS_FILE}).\n\n"
        f"Search-R1:\n\n    {search_r1_command(spec, final)}\n\n"
        "FlashRAG config (with your index_path and corpus_path):\n\n"
        + "".join(f"    {line}\n" for line in flashrag_config(spec, final).splitlines())
        + f"\nsentence-transformers: SentenceTransformer({str(final)!r}).encode(queries{prompt})\n"
        + (f"\nNot expressible as flags:\n{notes}" if notes else "")
    )


def _export_policy(config: Config, source: Path, staging: Path, out: Path) -> str:
    """``policy/`` for vLLM and the prompt it was trained on; its README section."""
    chat = _export_policy_dir(config, source, staging / "policy")
    (staging / PROMPT_FILE).write_text(PromptTemplate.load(config.policy.prompt_template).text)
    how = (
        "its chat template, the filled template as the single user message (/v1/chat/completions)"
        if chat
        else "no chat template: the filled template is the raw prompt (/v1/completions)"
    )
    return (
        "## policy/: the policy, for vLLM\n\n"
        f"    vllm serve {out / 'policy'} --dtype {config.policy.dtype} --served-model-name bridge-policy\n\n"
        f"Prompt as in training: {PROMPT_FILE} with {{question}} and {{max_turns}} = {config.rollout.max_turns}, "
        f"under {how}.\nStop at {' or '.join(STOP_STRINGS)}; answer a search with the passages between "
        f"{INFO_OPEN} and {INFO_CLOSE}.\n"
    )


def _export_policy_dir(config: Config, source: Path, target: Path) -> bool:
    """Copy ``source`` (weights hard-linked) and add a tokenizer and generation config when it has none; whether
    training wrapped prompts in the tokenizer's chat template."""
    trust = config.policy.trust_remote_code
    shutil.copytree(source, target, copy_function=_link_or_copy)
    if not _has_tokenizer(target):
        save_tokenizer(_base_tokenizer(config, source), target)
    if not (target / "generation_config.json").is_file():
        model_config = AutoConfig.from_pretrained(target, trust_remote_code=trust)
        GenerationConfig.from_model_config(model_config).save_pretrained(str(target))
    tokenizer = AutoTokenizer.from_pretrained(target, trust_remote_code=trust)
    return bool(tokenizer.chat_template) and config.policy.chat_template != "never"


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in TOKENIZER_FILES)


def _base_tokenizer(config: Config, source: Path):
    """The tokenizer of ``policy.model`` (training leaves it as it is). transformers makes an empty tokenizer of
    a folder without tokenizer files rather than failing, so such a folder is refused here."""
    name = config.policy.model
    base = Path(resolve_model_path(name))
    if base.is_dir() and not _has_tokenizer(base):
        raise InputError(f"{source} has no tokenizer, and neither has policy.model {base}")
    try:
        return load_tokenizer(name, config.policy.trust_remote_code)
    except OSError as exc:
        raise InputError(f"{source} has no tokenizer, and policy.model {name} gives none: {exc}") from None


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link weights (no second copy of gigabytes; pruning the checkpoint later leaves them whole), copy the
    rest, so editing a small file of the export never touches the checkpoint."""
    if src.endswith(".safetensors"):
        try:
            os.link(src, dst)
            return
        except OSError:  # another file system
            pass
    shutil.copy2(src, dst)
