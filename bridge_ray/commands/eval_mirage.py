"""``bridge-ray eval --suite mirage``: the paper's out-of-domain medical QA evaluation (MIRAGE, five sets).

Every ``--checkpoint`` runs the greedy search agent on the multiple-choice questions, prompted with their options
(``policy.prompt_template`` when it has an ``{options}`` placeholder, else ``agent/templates/mirage.txt``), over
``retrieval.index.dir`` (MedCorp: ``prepare-data --medcorp``, then ``build-index``). Layout of ``--out DIR``:

- ``<label>/responses.jsonl``: per question ``{"set", "id", "question", "options", "answer", "response",
  "prediction", "correct"}``; ``response`` is the policy's text with every ``<information>`` block removed, so
  the judge reads the reasoning, never the passages (the paper's blinded judge);
- ``<label>/judgments.jsonl``: per question the judge's ``score`` (0-4 or null) and ``status``, when judged;
- ``mirage.json`` and ``mirage.md``: the table, one row per checkpoint.

The files are written into a temporary folder beside ``--out`` and moved into it at the end, so a run that fails
(a checkpoint's engine, the judge) leaves no partial files.

Inputs (benchmark, sets, checkpoints, their configs, ``--out``) are all checked before any model loads. All
checkpoints generate first, one engine at a time, then the judge (``--judge``, default ``judge.backend``) runs.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bridge_ray.agent.choices import extract_choice
from bridge_ray.agent.prompt import PromptTemplate
from bridge_ray.atomic import filling, write_jsonl_atomic, write_text_atomic
from bridge_ray.checkpoint import CONFIG, POLICY_DIR, retriever_adapter_dir
from bridge_ray.config import Config, ConfigError, derive, load_config
from bridge_ray.data.mirage import MIRAGE_SETS, ChoiceQuestion, load_benchmark
from bridge_ray.errors import InputError
from bridge_ray.evaluation import judge as judging  # its functions looked up when called: tests replace them
from bridge_ray.evaluation.judge import strip_passages
from bridge_ray.evaluation.mirage import Answered, MirageRow, mirage_json, mirage_markdown, summarize_mirage
from bridge_ray.train.local_eval import local_sampler, policy_checkpoint

MIRAGE_TEMPLATE = Path(__file__).resolve().parents[1] / "agent" / "templates" / "mirage.txt"
Responses = dict[str, list[dict[str, Any]]]  # set name -> response rows


@dataclass(frozen=True)
class Target:
    """One row of the table: a label, the config it runs under, and the checkpoint (None: ``policy.model``)."""

    label: str
    config: Config
    checkpoint: Path | None


def run_mirage(args: argparse.Namespace) -> int:
    if args.data:
        raise InputError("--data: not with --suite mirage (its questions come from --benchmark)")
    if not args.benchmark or not args.out:
        raise InputError("--suite mirage needs --benchmark FILE (MIRAGE's benchmark.json) and --out DIR")
    benchmark = load_benchmark(args.benchmark, _set_names(args.sets))
    questions = {name: qs[: args.max_questions] for name, qs in benchmark.items()}
    out = Path(args.out)
    targets = [_target(item, args) for item in args.checkpoint or [None]]
    _check_unique_labels(targets)
    kind = args.judge or targets[0].config.judge.backend
    responses: dict[str, Responses] = {}
    with filling(out) as staged:  # every file moves into --out at the end: a failed run leaves none
        for target in targets:
            responses[target.label] = generate(target, questions)
            write_jsonl_atomic(staged / target.label / "responses.jsonl", _flat(responses[target.label]))
        verdicts = judge(targets[0].config, kind, responses, staged) if kind != "none" else {}
        rows = [_summarize(label, per_set, verdicts.get(label)) for label, per_set in responses.items()]
        write_text_atomic(staged / "mirage.json", mirage_json(rows) + "\n")
        write_text_atomic(staged / "mirage.md", mirage_markdown(rows) + "\n")
    if kind == "none":  # an earlier run's judgments (under --overwrite) judged other responses
        for label in responses:
            (out / label / "judgments.jsonl").unlink(missing_ok=True)
    print(mirage_markdown(rows))
    return 0


def _set_names(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise InputError(f"--sets {value!r}: name at least one set ({','.join(MIRAGE_SETS)})")
    return names


def _target(item: str | None, args: argparse.Namespace) -> Target:
    """A ``--checkpoint [LABEL=]DIR`` (None: the config's own policy, labelled ``base``) and its config."""
    if item is None:
        return Target("base", _config(args.config, args.overrides), None)
    label, sep, path = item.rpartition("=") if "=" in item else ("", "", item)
    if sep and (not label or "/" in label):
        raise InputError(f"--checkpoint {item!r}: expected DIR or LABEL=DIR (a label without '/')")
    checkpoint = policy_checkpoint(path)
    config = _config(args.config or checkpoint / CONFIG, args.overrides)
    return Target(label or checkpoint.name, config, checkpoint)


def _config(base: str | Path | None, overrides: Sequence[str]) -> Config:
    """The config with a prompt template that shows the options (see the module docstring)."""
    config = load_config(base, list(overrides))
    if config.eval.oracle_retrieval:
        raise ConfigError("eval.oracle_retrieval: MIRAGE's questions name no gold passages; leave it false")
    if "options" in PromptTemplate.load(config.policy.prompt_template).placeholders:
        return config
    return derive(config, {"policy.prompt_template": str(MIRAGE_TEMPLATE)}, source="eval-mirage's prompt")


def _check_unique_labels(targets: Sequence[Target]) -> None:
    labels = [t.label for t in targets]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise InputError(f"--checkpoint: two checkpoints are labelled {twice[0]!r}; name them with LABEL=DIR")


def generate(target: Target, questions: dict[str, list[ChoiceQuestion]]) -> Responses:
    """Per set, the response rows of ``target``'s greedy agent; its engine is released before returning."""
    checkpoint = target.checkpoint
    print(f"{target.label}: prompting with {target.config.policy.prompt_template}")
    policy = str(checkpoint / POLICY_DIR) if checkpoint else None
    sampler = local_sampler(target.config, policy=policy, adapter=retriever_adapter_dir(checkpoint))
    try:
        per_set: Responses = {}
        for name, qs in questions.items():
            trajectories = sampler.greedy_agent.rollout([q.record() for q in qs], 1)
            per_set[name] = [response_row(q, t.response_text, t.answer) for q, t in zip(qs, trajectories, strict=True)]
            print(f"{target.label}: {name} {sum(r['correct'] for r in per_set[name])}/{len(qs)} correct")
        return per_set
    finally:
        sampler.client.close()
        del sampler
        _release_accelerator_memory()


def _release_accelerator_memory() -> None:
    """Free the last engine's memory before the next checkpoint's engine (or the local judge) loads."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def response_row(question: ChoiceQuestion, response_text: str, answer: str | None) -> dict[str, Any]:
    prediction = extract_choice(answer, question.options)
    return {
        "set": question.set, "id": question.id, "question": question.question, "options": question.options,
        "answer": question.answer, "response": strip_passages(response_text), "prediction": prediction,
        "correct": prediction == question.answer,
    }


def _flat(per_set: Responses) -> list[dict[str, Any]]:
    return [row for rows in per_set.values() for row in rows]


def judge(config: Config, kind: str, responses: dict[str, Responses], out: Path) -> dict[str, dict[str, list]]:
    """The judge's verdicts, per label and set, on the responses as written (passages already removed)."""
    backend = judging.judge_backend_from_config(config.judge, kind)
    cache = judging.judge_cache_dir(config.judge)
    verdicts: dict[str, dict[str, list]] = {}
    for label, per_set in responses.items():
        rows = _flat(per_set)
        items = [judging.JudgeItem(r["question"], r["options"], r["answer"], r["response"]) for r in rows]
        judgments = judging.judge_items(items, backend, cache_dir=cache, concurrency=config.judge.concurrency)
        pairs = list(zip(rows, judgments, strict=True))
        write_jsonl_atomic(
            out / label / "judgments.jsonl",
            [{"set": r["set"], "id": r["id"], "score": j.score, "status": j.status} for r, j in pairs],
        )
        verdicts[label] = {name: [j for r, j in pairs if r["set"] == name] for name in per_set}
    return verdicts


def _summarize(label: str, per_set: Responses, verdicts: dict[str, list] | None) -> MirageRow:
    """The table row of one label; a question's verdict (if judged) gives its reasoning score."""
    answered = {}
    for name, rows in per_set.items():
        if verdicts is None:
            answered[name] = [Answered(r["correct"]) for r in rows]
        else:
            answered[name] = [Answered(r["correct"], True, j.score) for r, j in zip(rows, verdicts[name], strict=True)]
    return summarize_mirage(label, answered)
