"""MedCorp for ``prepare-data --medcorp``: MedRAG's chunked corpora combined into one corpus ``build-index`` reads.

Input, per source (``pubmed``, ``textbooks``, ``statpearls``, ``wikipedia``: MedRAG's names, or any other), a
folder of MedRAG chunk files (``<source>/chunk/*.jsonl``, or that ``chunk`` folder itself): one
``{"id", "title", "content", "contents"}`` object a line, ``contents`` being MedRAG's ``title. content``; a row
with only ``contents`` is taken too. Files are read in name order; empty files and blank lines (MedRAG writes no
final newline, and leaves some files empty) are skipped.

Output: ``<out>/medcorp.jsonl``, one FlashRAG row a chunk, ``{"id": "<source>/<id>", "contents": "\\"title\\"\\n
content", "source": "<source>"}``: the title line is what the policy's ``Doc i(Title: ...)`` shows, and the
source prefix keeps ids unique across corpora. The file is written beside its final name and moved into place
whole, so a bad row (named by file:line) leaves ``--out`` without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bridge_ray.atomic import replacing
from bridge_ray.data.qa import jsonl_objects
from bridge_ray.errors import InputError

MEDCORP_FILE = "medcorp.jsonl"


def chunk_files(source: str, folder: Path) -> list[Path]:
    """The chunk files of one source: ``folder/chunk/*.jsonl`` when there is a ``chunk`` folder, else
    ``folder/*.jsonl``."""
    if not folder.is_dir():
        raise InputError(f"--medcorp {source}={folder}: not a folder")
    chunk = folder / "chunk"
    files = sorted((chunk if chunk.is_dir() else folder).glob("*.jsonl"))
    if not files:
        raise InputError(f"--medcorp {source}={folder}: no .jsonl chunk files in it (or in its chunk/ folder)")
    return files


def medcorp_row(source: str, row: dict[str, Any], where: str) -> dict[str, str]:
    """One MedRAG chunk as a MedCorp corpus row (see the module docstring)."""
    doc_id, title = row.get("id"), row.get("title", "")
    if isinstance(doc_id, bool) or not isinstance(doc_id, str | int) or str(doc_id) == "":
        raise InputError(f"{where}: 'id' must be a non-empty string or an integer, got {doc_id!r}")
    if not isinstance(title, str):
        raise InputError(f"{where}: 'title' must be a string, got {title!r}")
    text = row["content"] if "content" in row else _content_of(row.get("contents"), title.strip())
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{where}: needs a non-empty 'content' (or 'contents') string, got {text!r}")
    return {"id": f"{source}/{doc_id}", "contents": f'"{title.strip()}"\n{text.strip()}', "source": source}


def _content_of(contents: Any, title: str) -> Any:
    """MedRAG's ``contents`` without the title it starts with (``title. content`` or ``title content``)."""
    if isinstance(contents, str) and title and contents.startswith(title):
        return contents[len(title) :].removeprefix(".")
    return contents


def medcorp_rows(sources: Sequence[tuple[str, Path]]) -> Iterator[dict[str, str]]:
    for source, folder in sources:
        for path in chunk_files(source, folder):
            for where, row in jsonl_objects(path, skip_blank=True):
                yield medcorp_row(source, row, where)


def parse_sources(items: Sequence[str]) -> list[tuple[str, Path]]:
    """``NAME=DIR`` flags, each name once and usable as an id prefix."""
    sources: list[tuple[str, Path]] = []
    for item in items:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder or "/" in name:
            raise InputError(f"--medcorp {item!r}: expected NAME=DIR (e.g. pubmed=corpus/pubmed)")
        if name in (s for s, _ in sources):
            raise InputError(f"--medcorp {name}: given twice")
        sources.append((name, Path(folder)))
    return sources


def write_medcorp(sources: Sequence[tuple[str, Path]], out: Path) -> dict[str, int]:
    """``out/medcorp.jsonl`` from ``sources``, moved into place whole; the rows written per source."""
    for source, folder in sources:  # every folder checked before a long write starts
        chunk_files(source, folder)
    out.mkdir(parents=True, exist_ok=True)
    counts = dict.fromkeys((s for s, _ in sources), 0)
    with replacing(out / MEDCORP_FILE) as tmp, tmp.open("w", encoding="utf-8") as f:
        for row in medcorp_rows(sources):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            counts[row["source"]] += 1
    return counts
