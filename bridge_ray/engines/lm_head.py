"""The LM head: logits of chosen hidden states, and log-probs of given tokens through it.

With Gemma's 262k vocabulary the head costs more per token than the transformer body, and its logits (a
megabyte per token in fp32) cost more to normalise than to compute when they are normalised in one block: so
callers project only the rows that predict a scored token, the head runs on blocks of rows, and the
log-softmax on cache-sized slices of each block.

A frozen head (a LoRA policy's, the scorer's) gets its gradient to the hidden states in the same pass
(:class:`_FrozenHeadLogProbs`): no block of logits is kept for the backward and none is computed twice. The
learner uses it where the head's matmul runs below fp32 (:func:`head_runs_in_fp32`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from bridge_ray.algo.logprob import token_log_probs
from bridge_ray.engines.precision import autocast_weight

if TYPE_CHECKING:  # type hints only: the control plane imports the engines without transformers
    from transformers import PreTrainedModel

# Logit elements (scored tokens x vocabulary) materialised per LM-head call: 64M floats = 256 MB.
MAX_LOGIT_ELEMENTS = 64 * 1024 * 1024
# Logits per log-sum-exp call, so that its temporaries stay in a core's L2 cache: 256k floats = 1 MB.
LOGSUMEXP_ELEMENTS = 256 * 1024


def head_logits(model: PreTrainedModel, hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """fp32 logits of ``hidden`` rows, as the model's forward computes them (final soft-capping included), divided
    by ``temperature`` as the samplers scale them (0, greedy, and 1 keep them raw).

    Under bf16 autocast the head's matmul runs in bf16 and its output is upcast here: Gemma 2's soft-capping
    ``cap · tanh(z / cap)`` (unset in Gemma 3) and every log-softmax taken from these logits run in fp32.
    """
    head = model.get_output_embeddings()
    weight = autocast_weight(head.weight, hidden.device.type)
    if weight is head.weight:
        logits = head(hidden).float()
    else:  # autocast's own cast of the input, the frozen weight's cast once (bitwise the same matmul)
        logits = torch.nn.functional.linear(hidden.to(weight.dtype), weight, getattr(head, "bias", None)).float()
    cap = _soft_cap(model)
    logits = torch.tanh(logits / cap) * cap if cap else logits
    return logits / temperature if temperature not in (0.0, 1.0) else logits


def head_log_probs(
    model: PreTrainedModel, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """fp32 ``log p(targets[s] | hidden[s])`` through the LM head, ``p = softmax(logits / temperature)``
    (temperature 0, greedy, keeps the raw logits, as the samplers do); gradients reach ``hidden`` and, when it is
    trained, the head.

    The head runs on ``MAX_LOGIT_ELEMENTS`` of logits at a time (each call reads the whole 262k x H weight, on
    CPU as costly as the matmul), the normaliser on ``LOGSUMEXP_ELEMENTS`` slices of them (three times faster on
    CPU than over the whole block), and a frozen head's gradient to ``hidden`` is taken in the same pass
    (:class:`_FrozenHeadLogProbs`). A trained head needs its own gradient and a ZeRO-3 partition (``ds_id``) is
    whole only inside the head's forward: both take autograd over one block.
    """
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    weight = model.get_output_embeddings().weight
    if torch.is_grad_enabled() and (weight.requires_grad or hasattr(weight, "ds_id")):
        return token_log_probs(head_logits(model, hidden, temperature), targets)
    return _FrozenHeadLogProbs.apply(hidden, model, targets, temperature)


def head_runs_in_fp32(model: PreTrainedModel, device_type: str) -> bool:
    """Whether the LM head's matmul runs in fp32 here: fp32 weights and no autocast."""
    dtype = model.get_output_embeddings().weight.dtype
    return (torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else dtype) == torch.float32


class _FrozenHeadLogProbs(torch.autograd.Function):
    """:func:`head_log_probs` through a frozen head, its gradient to the hidden states taken while the logits
    are in hand.

    Output ``s`` depends on hidden row ``s`` alone, so the backward only scales each row's Jacobian
    ``∂ out_s / ∂ hidden_s = (onehot(target_s) − p_s) / T · ∂z/∂h`` by the output's gradient: the forward computes
    it block by block, overwriting each slice of logits with ``onehot − p`` while the slice is in cache, then one
    matmul with the head's weight, as autograd's backward of the head would (in the same precision).
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, model: Any, targets: torch.Tensor, temperature: float) -> torch.Tensor:
        wanted = ctx.needs_input_grad[0]
        head = model.get_output_embeddings()
        weight = autocast_weight(head.weight, hidden.device.type)  # what the head's matmul multiplies by
        scale = temperature not in (0.0, 1.0)
        cap = _soft_cap(model)
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        jacobian = torch.empty_like(hidden) if wanted else None
        block = _block_rows(weight)
        for start in range(0, hidden.shape[0], block):
            rows, ids = hidden[start : start + block], targets[start : start + block]
            logits = head_logits(model, rows.detach())  # scaled below in place: a block is 256 MB
            if scale:
                logits /= temperature
            factor = 1.0 - (logits * (temperature if scale else 1.0) / cap) ** 2 if (wanted and cap) else None
            for first in range(0, rows.shape[0], _slice_rows(weight)):
                z = logits[first : first + _slice_rows(weight)]
                label = ids[first : first + z.shape[0]].long().unsqueeze(-1)
                lse = torch.logsumexp(z, dim=-1, keepdim=True)
                out[start + first : start + first + z.shape[0]] = (z.gather(-1, label) - lse).squeeze(-1)
                if wanted:  # ∂ log p / ∂ z = onehot − softmax(z), in place of the logits
                    z.sub_(lse).exp_().neg_().scatter_add_(-1, label, torch.ones_like(label, dtype=z.dtype))
            if wanted:
                if scale:
                    logits /= temperature
                if factor is not None:  # d(cap · tanh(x / cap)) / dx = 1 − tanh², tanh = capped / cap
                    logits *= factor
                jacobian[start : start + block] = (logits.to(weight.dtype) @ weight).to(hidden.dtype)
        ctx.save_for_backward(jacobian)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        (jacobian,) = ctx.saved_tensors
        return grad_out.to(jacobian.dtype)[:, None] * jacobian, None, None, None


def _block_rows(weight: torch.Tensor) -> int:
    return max(1, MAX_LOGIT_ELEMENTS // _vocab(weight))


def _slice_rows(weight: torch.Tensor) -> int:
    return max(1, LOGSUMEXP_ELEMENTS // _vocab(weight))


def _vocab(weight: torch.Tensor) -> int:
    """The head's output size, also of a ZeRO-3 partition (an empty tensor outside the head's forward)."""
    return int(getattr(weight, "ds_shape", weight.shape)[0])


def _soft_cap(model: PreTrainedModel) -> float | None:
    return getattr(model.config.get_text_config(), "final_logit_softcapping", None)
