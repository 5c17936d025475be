"""Filter-normalised random directions and 2-D loss surfaces (Li et al. 2018, "Visualizing the Loss Landscape
of Neural Nets", Sec. 4), as the paper draws Fig. 3: ``f(α, β) = L(θ + α d₁ + β d₂)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def filter_normalized_direction(weights: Sequence[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
    """A Gaussian direction shaped like ``weights``, each filter rescaled to its weight filter's norm (Li et al. eq. 1).

    ``d_{i,j} ← d_{i,j} / ‖d_{i,j}‖ · ‖θ_{i,j}‖`` for filter j of tensor i: a filter is a slice along the first
    dimension (an output unit of a linear layer, an output channel of a convolution), so a step α moves every
    unit by the same fraction of its own scale and the surfaces of differently scaled networks compare. 1-D
    tensors (biases, norm scales) get 0, as Li et al. do; a filter of norm 0 gets 0. Draws in float32 from
    ``generator`` whatever the weights' dtype, so the same seed gives the same draw at every checkpoint.
    """
    directions = []
    for weight in weights:
        if weight.dim() < 2:
            directions.append(torch.zeros_like(weight))
            continue
        draw = torch.randn(weight.shape, generator=generator, dtype=torch.float32).to(weight.device)
        rows, filters = draw.reshape(weight.shape[0], -1), weight.detach().float().reshape(weight.shape[0], -1)
        scale = filters.norm(dim=1, keepdim=True) / rows.norm(dim=1, keepdim=True).clamp(min=torch.finfo().tiny)
        directions.append((rows * scale).reshape(weight.shape).to(weight.dtype))
    return directions


def grid_axis(span: float, points: int) -> list[float]:
    """``points`` evenly spaced coefficients on ``[-span, span]``; an odd count puts 0 (the weights) on the grid."""
    if points < 3 or points % 2 == 0:
        raise ValueError(f"a grid axis needs an odd number of points >= 3, got {points}")
    if not span > 0:
        raise ValueError(f"a grid axis needs a span > 0, got {span}")
    centre = points // 2
    return [span * (k - centre) / centre for k in range(points)]  # the centre exactly 0, unlike linspace's


def loss_surface(
    params: Sequence[torch.Tensor],
    first: Sequence[torch.Tensor | None],
    second: Sequence[torch.Tensor | None],
    alphas: Sequence[float],
    betas: Sequence[float],
    evaluate: Callable[[int, int], dict[str, float]],
) -> dict[str, torch.Tensor]:
    """``evaluate`` at ``params + α_i first + β_j second`` for every grid point: name -> ``[len(alphas), len(betas)]``.

    ``first``/``second`` line up with ``params``; None is a zero direction on that tensor, so the two axes may
    live in different models (θ × η). The tensors are set in place without autograd, point by point in row-major
    order (α outer), each rewritten only when its own coefficient changes; ``evaluate(i, j)`` is told the point so
    that it can reuse work that depends on one axis only. On return, also after an error, every tensor holds its
    original values bit for bit.
    """
    if not len(params) == len(first) == len(second):
        raise ValueError(f"{len(params)} tensors but directions of {len(first)} and {len(second)}")
    moved = [k for k, (u, v) in enumerate(zip(first, second, strict=True)) if u is not None or v is not None]
    originals = {k: params[k].detach().clone() for k in moved}
    written: dict[int, tuple] = {}
    values: dict[str, torch.Tensor] = {}
    shape = (len(alphas), len(betas))
    try:
        with torch.no_grad():
            for i, alpha in enumerate(alphas):
                for j, beta in enumerate(betas):
                    for k in moved:
                        coefficients = (alpha if first[k] is not None else None,
                                        beta if second[k] is not None else None)
                        if written.get(k) == coefficients:
                            continue
                        params[k].copy_(originals[k])
                        if first[k] is not None:
                            params[k].add_(first[k], alpha=alpha)
                        if second[k] is not None:
                            params[k].add_(second[k], alpha=beta)
                        written[k] = coefficients
                    for name, value in evaluate(i, j).items():
                        values.setdefault(name, torch.full(shape, float("nan"), dtype=torch.float64))
                        values[name][i, j] = value
    finally:
        with torch.no_grad():
            for k in moved:
                params[k].copy_(originals[k])
    return values
