"""The bilevel order with the two-state estimator: η*'s update is its own phase, between η_γ's and the policy's."""

import pytest

from bridge_ray.coordinator.phases import (
    LOWER_RETRIEVER_UPDATE,
    POLICY_UPDATE,
    RETRIEVER_UPDATE,
    OrderViolation,
    PhaseRecord,
    check_bilevel_order,
)


def _round(lower: tuple[float, float] | None, policy_start: float = 5.0) -> list[PhaseRecord]:
    records = [PhaseRecord(2, RETRIEVER_UPDATE, 0.0, 2.0, 0, 0, {"turns": 4})]
    if lower is not None:
        records.append(PhaseRecord(2, LOWER_RETRIEVER_UPDATE, *lower, 0, 1))
    return [*records, PhaseRecord(2, POLICY_UPDATE, policy_start, 6.0, 0, 1, {"estimator": "two_state"})]


def test_eta_star_updates_after_eta_gamma_and_before_the_policy():
    check_bilevel_order(_round((2.5, 4.0)))
    with pytest.raises(OrderViolation, match=r"round 2: lower_retriever_update ended at 5\.500, after policy_update"):
        check_bilevel_order(_round((2.5, 5.5)))
    with pytest.raises(OrderViolation, match=r"round 2: retriever_update ended at .* after lower_retriever_update"):
        check_bilevel_order(_round((1.0, 4.0)))


def test_a_two_state_round_with_searches_needs_the_eta_star_update():
    with pytest.raises(OrderViolation, match="two_state policy_update without lower_retriever_update"):
        check_bilevel_order(_round(None))
    no_searches = _round(None)
    no_searches[0].info["turns"] = 0  # nothing to update either state on: no L_RAG terms
    check_bilevel_order(no_searches)
