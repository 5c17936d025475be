"""The presets' question files from the data a user already has, for ``prepare-data``.

Input: a FlashRAG dataset root (``<root>/<name>/<split>.jsonl``) or Search-R1 / verl-tool parquet files (their
``train.parquet`` with the NQ + HotpotQA mix, their ``test.parquet`` with the seven eval sets, rows told apart
by ``data_source``). Output: the files the presets (``jobs/configs/qwen2.5-*.yaml``) read from ``data/``, so
every preset runs as is: each eval set as FlashRAG jsonl ``<out>/<name>_<split>.jsonl``, and the training mix as
``<out>/nq_hotpotqa_train.parquet`` (where Search-R1 users put their ``train.parquet``) in the columns the
parquet loader reads (``id``, ``data_source``, ``question``, ``golden_answers``): ``data_source`` keeps the two
sets' uids apart in one file.

Every set is read with the real loaders before anything is written, so a bad row stops the command naming its
file and row with ``--out`` untouched; each file is then moved into place whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bridge_ray.atomic import replacing
from bridge_ray.data.qa import QuestionRecord, load_flashrag_jsonl, load_searchr1_parquet
from bridge_ray.errors import InputError


@dataclass(frozen=True)
class QuestionSet:
    """One split of a FlashRAG data set: ``name`` (also Search-R1's ``data_source``) and ``split``."""

    name: str
    split: str
    searchr1_file: str  # "train" or "test": which of Search-R1's parquet files holds it
    file_name: str  # the file under --out that holds it

    @classmethod
    def eval_set(cls, name: str, split: str) -> QuestionSet:
        return cls(name, split, "test", f"{name}_{split}.jsonl")


TRAIN_FILE = "nq_hotpotqa_train.parquet"
# The training mix both appendices name ("169,615 examples from NQ and HotpotQA", Search-R1's train.parquet): NQ
# train (79,168) + HotpotQA train (90,447). Printed beside the count written, so a partial input shows.
PAPER_TRAIN_SIZES = {"nq": 79_168, "hotpotqa": 90_447}

# Search-R1's data (scripts/nq_hotpotqa/data_process.sh): NQ + HotpotQA train for training; for evaluation the
# test split where FlashRAG has one, else dev (FlashRAG has no test split of HotpotQA, 2Wiki or Musique).
LAYOUT: tuple[QuestionSet, ...] = (
    QuestionSet("nq", "train", "train", TRAIN_FILE),
    QuestionSet("hotpotqa", "train", "train", TRAIN_FILE),
    QuestionSet.eval_set("nq", "test"),
    QuestionSet.eval_set("triviaqa", "test"),
    QuestionSet.eval_set("popqa", "test"),
    QuestionSet.eval_set("hotpotqa", "dev"),
    QuestionSet.eval_set("2wikimultihopqa", "dev"),
    QuestionSet.eval_set("musique", "dev"),
    QuestionSet.eval_set("bamboogle", "test"),
)


@dataclass
class Prepared:
    """The sets found (with where from), why each other set of the layout is missing, and what was left out."""

    found: dict[QuestionSet, tuple[str, list[QuestionRecord]]] = field(default_factory=dict)
    missing: dict[QuestionSet, str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # data sources of a parquet file outside the layout


def from_flashrag_root(root: Path) -> Prepared:
    """Every set of the layout found as ``<root>/<name>/<split>.jsonl``."""
    if not root.is_dir():
        raise InputError(f"--flashrag-root {root}: not a folder")
    prepared = Prepared()
    for qset in LAYOUT:
        path = root / qset.name / f"{qset.split}.jsonl"
        if path.is_file():
            prepared.found[qset] = (str(path), load_flashrag_jsonl(path))
        else:
            prepared.missing[qset] = f"no {path}"
    return prepared


def from_searchr1(files: dict[str, Path | None]) -> Prepared:
    """The sets of each Search-R1 file (``{"train": path, "test": path}``; None: not given), by ``data_source``."""
    prepared = Prepared()
    for kind, path in files.items():
        wanted = [qset for qset in LAYOUT if qset.searchr1_file == kind]
        if path is None:
            prepared.missing.update({qset: f"no --searchr1-{kind} file given" for qset in wanted})
            continue
        if not path.is_file():
            raise InputError(f"--searchr1-{kind} {path}: no such file")
        by_source = _by_source(load_searchr1_parquet(path))
        for qset in wanted:
            records = by_source.pop(qset.name, None)
            if records:
                prepared.found[qset] = (f"{path} (data_source {qset.name})", records)
            else:
                prepared.missing[qset] = f"no rows with data_source {qset.name!r} in {path}"
        prepared.left_out += [f"{source}: {len(rows)} questions of {path}" for source, rows in by_source.items()]
    return prepared


def train_mix_line(prepared: Prepared) -> str | None:
    """The training mix written, set by set, against the paper's sizes (None: no training set was found)."""
    sets = [(qset.name, len(records)) for qset, (_, records) in prepared.found.items() if qset.file_name == TRAIN_FILE]
    if not sets:
        return None
    paper = sum(PAPER_TRAIN_SIZES.values())
    parts = " + ".join(f"{name} {n:,} (paper {PAPER_TRAIN_SIZES[name]:,})" for name, n in sets)
    return f"training mix {TRAIN_FILE}: {sum(n for _, n in sets):,} questions = {parts}; the paper's: {paper:,}"


def _by_source(records: Sequence[QuestionRecord]) -> dict[str, list[QuestionRecord]]:
    groups: dict[str, list[QuestionRecord]] = {}
    for record in records:
        groups.setdefault(record.source, []).append(record)
    return groups


Sets = list[tuple[QuestionSet, list[QuestionRecord]]]


def write_sets(out: Path, prepared: Prepared) -> None:
    """Each file of the layout holding a set found; files of other names in ``out`` are kept."""
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Sets] = {}
    for qset, (_, records) in prepared.found.items():
        files.setdefault(qset.file_name, []).append((qset, records))
    for name, sets in files.items():
        with replacing(out / name) as tmp:
            (_write_parquet if name.endswith(".parquet") else _write_jsonl)(tmp, sets)


def _write_jsonl(path: Path, sets: Sets) -> None:
    with path.open("w", encoding="utf-8") as f:
        for _, records in sets:
            for r in records:
                row = {"id": r.question_id, "question": r.question, "golden_answers": r.golden_answers}
                f.write(json.dumps({**row, "metadata": r.metadata}, ensure_ascii=False) + "\n")


def _write_parquet(path: Path, sets: Sets) -> None:
    rows = [
        {"id": r.question_id, "data_source": qset.name, "question": r.question, "golden_answers": r.golden_answers}
        for qset, records in sets
        for r in records
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
