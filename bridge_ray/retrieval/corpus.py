"""Corpus I/O: streamed FlashRAG jsonl in, a random-access passage store out.

Two row formats are read: FlashRAG ``{"id", "contents"}`` (title = first line of ``contents``, often in
quotes) and ``{"id", "title", "text"}``. Each row has two forms: the :class:`Document` the passage encoder
embeds (``contents`` verbatim, else ``text`` verbatim: what Search-R1's and FlashRAG's index builders embed,
see ``presets.PASSAGE_TEXT``) and the display :class:`Passage` (title without quotes, text) that the policy
reads in ``<information>``; the display form is never encoded. Rows are streamed one line at a time, so
wiki-18 (21M rows) is never held in memory. The passage store keeps each row's original bytes plus an offsets
array, so a shard serves any row by id with one seek, and the HTTP API can return rows exactly as the user's
corpus has them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bridge_ray.errors import InputError
from bridge_ray.retrieval.types import Passage

PASSAGES_FILE = "passages.jsonl"
OFFSETS_FILE = "passages.offsets.npy"


class CorpusFormatError(InputError):
    """A malformed corpus line; the message names the file and the line number."""


@dataclass
class SkippedLines:
    """Lines left out under ``skip_bad_lines``: how many and which (line number, reason)."""

    lines: list[tuple[int, str]] = field(default_factory=list)

    def summary(self, path: str | Path, shown: int = 10) -> str:
        listed = ", ".join(f"line {n} ({why})" for n, why in self.lines[:shown])
        more = f" and {len(self.lines) - shown} more" if len(self.lines) > shown else ""
        return f"{path}: skipped {len(self.lines)} malformed line(s): {listed}{more}"


@dataclass(frozen=True)
class Document:
    """A corpus row as the passage encoder sees it: its id and the exact string embedded after the prefix."""

    id: str
    contents: str


@dataclass(frozen=True)
class CorpusRow:
    line_no: int
    raw: bytes  # the line as stored in the corpus, without its newline
    passage: Passage


def strip_title(title: str) -> str:
    """Display form of a title: surrounding whitespace and one pair of enclosing double quotes removed."""
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1].strip()
    return title


def passage_from_row(row: object) -> Passage:
    """Read one parsed corpus row of either format; ``ValueError`` says what is wrong with it."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    if "id" not in row:
        raise ValueError("missing key 'id'")
    doc_id = row["id"]
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise ValueError(f"'id' must be a string or an integer, got {type(doc_id).__name__}")
    if "contents" in row:
        contents = row["contents"]
        if not isinstance(contents, str):
            raise ValueError(f"'contents' must be a string, got {type(contents).__name__}")
        title, _, text = contents.partition("\n")
        return Passage(id=str(doc_id), title=strip_title(title), text=text.strip())
    if "title" in row and "text" in row:
        title, text = row["title"], row["text"]
        if not isinstance(title, str) or not isinstance(text, str):
            raise ValueError("'title' and 'text' must be strings")
        return Passage(id=str(doc_id), title=strip_title(title), text=text.strip())
    raise ValueError("expected keys {'id', 'contents'} or {'id', 'title', 'text'}")


def document_from_row(row: dict) -> Document:
    """The encoder's view of a row already validated by :func:`passage_from_row` (``presets.PASSAGE_TEXT``).

    ``contents`` verbatim, as Search-R1's ``index_builder.py`` embeds it; a ``{title, text}`` row embeds its
    ``text`` verbatim, as FlashRAG's ``load_corpus`` maps it (``contents = text``).
    """
    return Document(id=str(row["id"]), contents=row["contents"] if "contents" in row else row["text"])


def read_corpus(
    path: str | Path, skip_bad_lines: bool = False, skipped: SkippedLines | None = None
) -> Iterator[CorpusRow]:
    """Stream the rows of a corpus jsonl file.

    A malformed line raises :class:`CorpusFormatError` naming ``path:line``; with ``skip_bad_lines`` it is
    recorded in ``skipped`` instead (pass one to learn how many and which lines were left out).
    """
    path = Path(path)
    if skip_bad_lines and skipped is None:
        raise ValueError("skip_bad_lines needs a SkippedLines to report the skipped lines in")
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            raw = line.rstrip(b"\r\n")
            try:
                if not raw.strip():
                    raise ValueError("empty line")
                passage = passage_from_row(json.loads(raw))
            except (ValueError, UnicodeDecodeError) as exc:
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                if not skip_bad_lines:
                    raise CorpusFormatError(f"{path}:{line_no}: malformed corpus line: {reason}") from None
                skipped.lines.append((line_no, reason))
                continue
            yield CorpusRow(line_no, raw, passage)


def write_passage_store(rows: Iterator[CorpusRow], out_dir: str | Path) -> int:
    """Write rows to ``out_dir/passages.jsonl`` with their byte offsets; returns the number of rows.

    Written under temporary names and renamed at the end, so a store on disk is always complete; a failure
    (a malformed line) removes the temporary files, leaving nothing behind for a retry to trip over.
    """
    out_dir = Path(out_dir)
    tmp_data, tmp_offsets = out_dir / f".{PASSAGES_FILE}.tmp", out_dir / f".{OFFSETS_FILE}.tmp"
    offsets = [0]
    try:
        with tmp_data.open("wb") as f:
            for row in rows:
                f.write(row.raw + b"\n")
                offsets.append(offsets[-1] + len(row.raw) + 1)
        with tmp_offsets.open("wb") as f:
            np.save(f, np.asarray(offsets, dtype=np.int64))
    except BaseException:
        tmp_data.unlink(missing_ok=True)
        tmp_offsets.unlink(missing_ok=True)
        raise
    os.replace(tmp_data, out_dir / PASSAGES_FILE)
    os.replace(tmp_offsets, out_dir / OFFSETS_FILE)
    return len(offsets) - 1


class PassageStore:
    """Random access to the rows of a passage store by global row id (memory-mapped offsets)."""

    def __init__(self, index_dir: str | Path):
        index_dir = Path(index_dir)
        self.path = index_dir / PASSAGES_FILE
        self.offsets = np.load(index_dir / OFFSETS_FILE, mmap_mode="r")
        self._file = self.path.open("rb")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def raw(self, ids: Sequence[int]) -> list[bytes]:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self):
                raise IndexError(f"passage id {i} out of range [0, {len(self)}) of {self.path}")
            start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
            out.append(os.pread(self._file.fileno(), stop - start - 1, start))  # no shared file position
        return out

    def rows(self, ids: Sequence[int]) -> list[dict]:
        return [json.loads(raw) for raw in self.raw(ids)]

    def passages(self, ids: Sequence[int]) -> list[Passage]:
        return [passage_from_row(row) for row in self.rows(ids)]

    def iter_documents(self, start: int, stop: int) -> Iterator[Document]:
        """Rows ``start..stop-1`` in order as the encoder embeds them, read through a handle of their own."""
        with self.path.open("rb") as f:
            f.seek(int(self.offsets[start]))
            for _ in range(start, stop):
                yield document_from_row(json.loads(f.readline()))

    def close(self) -> None:
        self._file.close()
