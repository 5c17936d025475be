"""Filter-normalised directions and loss surfaces (Li et al. 2018): each filter of a direction has its weight
filter's norm, 1-D tensors get none, and the grid visits every point then restores the weights bit for bit."""

import pytest
import torch

from bridge_ray.algo.landscape import filter_normalized_direction, grid_axis, loss_surface


def _weights() -> list[torch.Tensor]:
    torch.manual_seed(0)
    matrix = torch.randn(5, 7) * torch.arange(1, 6).float().unsqueeze(1)  # filters of different scales
    conv = torch.randn(3, 2, 4, 4)
    matrix[2] = 0.0  # a dead unit
    return [matrix, conv, torch.randn(5), torch.randn(3)]  # + a bias and a norm scale


def test_each_filter_has_its_weight_filters_norm_and_1d_tensors_are_zeroed():
    weights = _weights()
    directions = filter_normalized_direction(weights, torch.Generator().manual_seed(1))
    assert [d.shape for d in directions] == [w.shape for w in weights]
    for weight, direction in zip(weights[:2], directions[:2], strict=True):
        torch.testing.assert_close(direction.reshape(len(direction), -1).norm(dim=1),
                                   weight.reshape(len(weight), -1).norm(dim=1))
    assert directions[0][2].abs().sum() == 0 and directions[0][3].abs().sum() > 0
    assert all(torch.equal(d, torch.zeros_like(w)) for d, w in zip(directions[2:], weights[2:], strict=True))
    # the draw is random (not the weights rescaled), and the same seed gives the same direction
    assert not torch.allclose(directions[0][1] / directions[0][1].norm(), weights[0][1] / weights[0][1].norm())
    again = filter_normalized_direction(weights, torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(directions, again, strict=True))


def test_grid_axis_is_odd_and_centred():
    assert grid_axis(1.0, 5) == pytest.approx([-1.0, -0.5, 0.0, 0.5, 1.0])
    assert grid_axis(0.25, 7)[3] == 0.0 and grid_axis(0.25, 7)[-1] == 0.25  # the weights themselves, exactly
    for points, span in ((4, 1.0), (1, 1.0), (3, 0.0)):
        with pytest.raises(ValueError):
            grid_axis(span, points)


def test_surface_visits_every_point_and_restores_the_weights_exactly():
    theta, eta, frozen = torch.randn(4, 3), torch.randn(2, 2), torch.randn(3)
    params = [theta, eta, frozen]
    saved = [p.clone() for p in params]
    d1, d2 = torch.randn(4, 3), torch.randn(2, 2)
    alphas, betas = [-0.5, 0.0, 0.5, 1.0], [-1.0, 0.0, 2.0]
    visits = []

    def evaluate(i: int, j: int) -> dict[str, float]:
        visits.append((i, j))
        torch.testing.assert_close(theta, saved[0] + alphas[i] * d1)  # θ moves along α only,
        torch.testing.assert_close(eta, saved[1] + betas[j] * d2)  # η along β only,
        assert torch.equal(frozen, saved[2])  # a tensor without a direction never moves
        return {"sum": float(theta.sum() + eta.sum()), "i": float(i)}

    grids = loss_surface(params, [d1, None, None], [None, d2, None], alphas, betas, evaluate)
    assert visits == [(i, j) for i in range(4) for j in range(3)]
    assert grids["sum"].shape == (4, 3) and torch.equal(grids["i"][:, 0], torch.arange(4.0, dtype=torch.float64))
    assert grids["sum"][1, 1] == pytest.approx(float(saved[0].sum() + saved[1].sum()))  # the centre: unperturbed
    assert all(torch.equal(p, s) for p, s in zip(params, saved, strict=True))


def test_two_directions_on_one_tensor_add_and_the_weights_survive_an_error():
    weight = torch.randn(3, 3)
    saved = weight.clone()
    d1, d2 = torch.randn(3, 3), torch.randn(3, 3)

    def evaluate(i: int, j: int) -> dict[str, float]:
        torch.testing.assert_close(weight, saved + [0.0, 1.0][i] * d1 + [0.0, -2.0][j] * d2)
        if (i, j) == (1, 1):
            raise RuntimeError("evaluation failed")
        return {"norm": float(weight.norm())}

    with pytest.raises(RuntimeError, match="evaluation failed"):
        loss_surface([weight], [d1], [d2], [0.0, 1.0], [0.0, -2.0], evaluate)
    assert torch.equal(weight, saved)
