"""Replayed retriever steps are judged on the probe's fixed searches: the gold recall of their top m."""

from types import SimpleNamespace

import numpy as np

from bridge_ray.sweep.replay import probe_recall


def test_probe_recall_counts_gold_in_the_top_m_of_any_search_of_the_question():
    class Client:
        num_candidates, num_shown = 4, 2

        def search(self, queries, k):
            ranked = {"q1": [1, 2, 3, 4], "q2": [5, 6, 7, 8], "q3": [9, 1, 2, 3]}
            return SimpleNamespace(ids=np.array([ranked[q][:k] for q in queries])), 0

    probe = [{"gold": ["1", "7"], "queries": ["q1", "q2"]},  # 1 in q1's top 2; 7 is third in q2
             {"gold": ["3"], "queries": ["q3"]},  # fourth
             {"gold": ["9"], "queries": []}]  # never searched
    assert probe_recall(Client(), probe) == [50.0, 0.0, 0.0]
