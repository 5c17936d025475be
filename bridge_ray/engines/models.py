"""Loading the policy: its tokenizer and causal LM, from any name :func:`~bridge_ray.model_paths.resolve_model_path`
resolves (an HF id, a local directory, or the packaged Gemma 3 270M GGUF, converted once into the cache)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge_ray.model_paths import resolve_model_path

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_tokenizer(name: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer  # not at import: the job driver imports this module, without transformers

    return AutoTokenizer.from_pretrained(resolve_model_path(name), trust_remote_code=trust_remote_code)


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id batches are padded with: the tokenizer's pad token, else its EOS (padding is always masked)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def config_pad_token_id(config: Any) -> int:
    """The padding id of a model, from its config (as its tokenizer's, without loading that): its pad token, else
    its first EOS, else 0. Padding is always masked; the samplers pad with the same id."""
    pad = getattr(config, "pad_token_id", None)
    eos = getattr(config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list | tuple) else eos
    return next((i for i in (pad, eos) if i is not None), 0)


def load_causal_lm(
    name: str, dtype: str | torch.dtype = "float32", trust_remote_code: bool = False
) -> PreTrainedModel:
    """The policy as a plain HF causal LM in eval mode (callers switch to train mode themselves).

    ``dtype`` is the weights' dtype; a config's ``auto`` is resolved first (:mod:`bridge_ray.engines.precision`),
    since transformers' own ``auto`` means the checkpoint's dtype.
    """
    from transformers import AutoModelForCausalLM  # as in load_tokenizer

    if dtype == "auto":
        raise ValueError("load_causal_lm: resolve dtype auto with bridge_ray.engines.precision.resolve_precision")

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(name), dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=True
    )
    return model.eval()
