"""Writes an encoder directory the size of E5-base (BERT-base: 12 layers, 768 wide, 30522 ids, 110M parameters)
with random weights, for ``bench retriever-update`` on a machine that cannot download E5. Its WordPiece vocabulary
is the bundled world's words (the rest of the 30522 ids go unused), so queries and passages have realistic lengths.

    python dev/gpu/e5_base_like.py OUT_DIR
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

from bridge_ray.data.world import SMALL_SIZE, write_world

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def main(out: Path) -> None:
    config = BertConfig()  # BERT-base, the architecture of intfloat/e5-base-v2
    with tempfile.TemporaryDirectory() as tmp:
        world = write_world(Path(tmp), seed=0, size=SMALL_SIZE)
        words = Counter(re.findall(r"\w+|[^\w\s]", (world / "corpus.jsonl").read_text().lower()))
    vocab = SPECIALS + [w for w, _ in words.most_common(config.vocab_size - len(SPECIALS))]
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(out / "vocab.txt")).save_pretrained(out)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(out)
    print(f"wrote {out}: {len(vocab)} words, {sum(p.numel() for p in BertModel(config).parameters()) / 1e6:.0f}M")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
