"""The named variants of the algorithm that a config chooses among (``algorithm.estimator``, ``grpo.loss_agg``,
``grpo.kl_kind``): light (no torch), so the config names them without loading the math."""

from __future__ import annotations

from typing import Literal, get_args

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "turn-mean"]
KLKind = Literal["k1", "k2", "k3"]
ThetaEstimator = Literal["bridge", "drop", "two_state"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
KL_KINDS: tuple[str, ...] = get_args(KLKind)
THETA_ESTIMATORS: tuple[str, ...] = get_args(ThetaEstimator)
