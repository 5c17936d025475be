"""``bridge-ray prepare-data``: the presets' question files (NQ + HotpotQA train, seven eval sets) from a FlashRAG
dataset root or Search-R1 / verl-tool parquet files; or, with ``--medcorp``, the medical eval's corpus
(``medcorp.jsonl``, see ``bridge_ray.data.medcorp``) from MedRAG's chunked corpora.

``--out`` must be new or empty unless ``--overwrite``. A set of the layout that is not in the input is an error
listing every such set, with nothing written, unless ``--allow-missing``: a preset naming it then fails at its
preflight, naming the file, rather than evaluating on fewer sets than the paper without a word.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge_ray.cli import add_out_argument
from bridge_ray.data.medcorp import MEDCORP_FILE, parse_sources, write_medcorp
from bridge_ray.data.prepare import QuestionSet, from_flashrag_root, from_searchr1, train_mix_line, write_sets
from bridge_ray.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_out_argument(parser, "folder", "where the files go: new or empty (the presets read data/ at the repository "
                     "root)", required=True, what="question files",
                     remedy="choose another --out, or pass --overwrite to write the question files there",
                     overwrite="write into a non-empty --out (other files are kept)")
    parser.add_argument("--allow-missing", action="store_true", help="write the sets found even if some are missing")
    parser.add_argument(
        "--flashrag-root", metavar="DIR", help="FlashRAG dataset root holding <name>/<split>.jsonl (nq/train.jsonl, …)"
    )
    parser.add_argument(
        "--searchr1-train", metavar="FILE", help="Search-R1 or verl-tool train.parquet (data_source nq and hotpotqa)"
    )
    parser.add_argument(
        "--searchr1-test", metavar="FILE", help="Search-R1 or verl-tool test.parquet (the seven eval data_sources)"
    )
    parser.add_argument(
        "--medcorp",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a MedRAG chunked corpus (pubmed=DIR, textbooks=DIR, ...; repeatable): write <out>/medcorp.jsonl",
    )


def run(args: argparse.Namespace) -> int:
    parquet = {"train": args.searchr1_train, "test": args.searchr1_test}
    modes = [args.flashrag_root is not None, any(p is not None for p in parquet.values()), bool(args.medcorp)]
    if sum(modes) != 1:
        raise InputError(
            "give one input: --flashrag-root DIR, or --searchr1-train / --searchr1-test FILE (question files), or "
            "--medcorp NAME=DIR (the medical corpus)"
        )
    out = Path(args.out)
    if args.medcorp:
        return _medcorp(args.medcorp, out)
    if args.flashrag_root is not None:
        prepared = from_flashrag_root(Path(args.flashrag_root))
    else:
        prepared = from_searchr1({kind: Path(p) if p else None for kind, p in parquet.items()})
    missing = [f"{_label(qset)}: {why}" for qset, why in prepared.missing.items()]
    if missing and not args.allow_missing:
        raise InputError("\n  ".join(["question sets missing (--allow-missing writes the others):", *missing]))
    write_sets(out, prepared)
    print(f"wrote {len(prepared.found)} question sets to {out}:")
    for qset, (origin, records) in prepared.found.items():
        print(f"  {_label(qset):<42} {len(records):>7} questions  (from {origin})")
    if mix := train_mix_line(prepared):
        print(mix)
    for qset, why in prepared.missing.items():
        stale = f" (the {qset.file_name} there is an older one)" if (out / qset.file_name).exists() else ""
        print(f"missing: {_label(qset)}: {why}{stale}")
    for line in prepared.left_out:
        print(f"left out (no preset reads it): {line}")
    return 0


def _medcorp(items: list[str], out: Path) -> int:
    counts = write_medcorp(parse_sources(items), out)
    print(f"wrote {sum(counts.values())} chunks to {out / MEDCORP_FILE}:")
    for source, count in counts.items():
        print(f"  {source:<12} {count:>10} chunks")
    print(f"next: python -m bridge_ray build-index --corpus {out / MEDCORP_FILE} --encoder intfloat/e5-base-v2 --out …")
    return 0


def _label(qset: QuestionSet) -> str:
    return f"{qset.name}/{qset.split} ({qset.file_name})"
