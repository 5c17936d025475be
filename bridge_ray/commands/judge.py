"""``bridge-ray judge``: score the reasoning of medical-QA responses with the blinded LLM judge (``judge.*``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bridge_ray.atomic import write_jsonl_atomic
from bridge_ray.cli import add_config_arguments, add_deprecated_flag, add_out_argument, config_from_args
from bridge_ray.data.qa import jsonl_objects
from bridge_ray.errors import InputError
from bridge_ray.evaluation.judge import (
    STATUSES,
    JudgeItem,
    Judgment,
    judge_backend_from_config,
    judge_cache_dir,
    judge_items,
    reasoning_quality,
    status_counts,
)

JUDGES = ("local", "openai")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    rows = "set, id, question, options (letter -> text), answer (letter or text), response"
    parser.add_argument("--responses", required=True, metavar="FILE", help=f"JSONL rows: {rows}")
    add_out_argument(parser, "file", "the rows plus judge_score/status/reason (JSONL)", required=True)
    parser.add_argument("--judge", choices=JUDGES, help="which judge scores the reasoning (judge.backend)")
    add_deprecated_flag(parser, "--backend", "--judge", choices=JUDGES)
    add_config_arguments(parser)


def _check_row(where: str, row: dict[str, Any]) -> None:
    """Raise naming ``file:line`` and the field when a row cannot be judged."""
    for key in ("set", "question", "answer"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise InputError(f"{where}: {key!r} must be a non-empty string, got {row.get(key)!r}")
    if isinstance(row.get("id"), bool) or not isinstance(row.get("id"), str | int):
        raise InputError(f"{where}: 'id' must be a string or an integer, got {row.get('id')!r}")
    options = row.get("options")
    if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
        raise InputError(f"{where}: 'options' must be an object of letter -> text, got {options!r}")
    if not isinstance(row.get("response"), str):
        raise InputError(f"{where}: 'response' must be a string, got {row.get('response')!r}")


def read_responses(path: Path) -> list[dict[str, Any]]:
    """Every row of ``path``, checked before any model loads; blank lines are skipped."""
    if not path.is_file():
        raise InputError(f"--responses {path}: not a file")
    rows = []
    for where, row in jsonl_objects(path, skip_blank=True):
        _check_row(where, row)
        rows.append(row)
    if not rows:
        raise InputError(f"--responses {path}: no rows")
    return rows


def _summary(rows: list[dict[str, Any]], judgments: list[Judgment]) -> str:
    """Per set (and over all rows when there are several): reasoning quality 0-100 and the count of each status."""
    sets: dict[str, list[Judgment]] = {}
    for row, judgment in zip(rows, judgments, strict=True):
        sets.setdefault(row["set"], []).append(judgment)
    if len(sets) > 1:
        sets["all"] = list(judgments)
    lines = [f"| set | n | reasoning quality | {' | '.join(STATUSES)} |", "|---|---:|---:|" + "---:|" * len(STATUSES)]
    for name, group in sets.items():
        quality = reasoning_quality(group)
        counts = status_counts(group)
        figure = f"{quality:.1f}" if quality is not None else "-"
        lines.append(f"| {name} | {len(group)} | {figure} | {' | '.join(str(counts[s]) for s in STATUSES)} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args, {"judge.backend": args.judge})
    responses, out = Path(args.responses), Path(args.out)
    if out.resolve() == responses.resolve():
        raise InputError(f"--out {out}: the same file as --responses; write the judged rows elsewhere")
    rows = read_responses(responses)

    items = [JudgeItem(r["question"], r["options"], r["answer"], r["response"]) for r in rows]
    cfg = config.judge
    judgments = judge_items(items, judge_backend_from_config(cfg), judge_cache_dir(cfg), cfg.concurrency)
    judged = [
        {**row, "judge_score": j.score, "judge_status": j.status, "judge_reason": j.brief_reason}
        for row, j in zip(rows, judgments, strict=True)
    ]
    write_jsonl_atomic(out, judged)
    print(_summary(rows, judgments))
    print(f"wrote {out}")
    failed = [j for j in judgments if j.status == "error"]
    if failed:
        print(f"{len(failed)} judgments failed (not cached; a rerun retries only them): {failed[0].brief_reason}")
        return 1
    return 0
