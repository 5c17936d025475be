"""The prefix store's look-up: the longest stored sequence a prompt starts with, never the whole prompt."""

import torch

from bridge_ray.engines.prefix_cache import CachedRow, PrefixStore, reusable


def row(*ids):
    kv = (torch.zeros(1, len(ids), 2),)
    return CachedRow(tuple(ids), kv, kv)


def test_a_prompt_reuses_the_longest_stored_sequence_it_starts_with():
    store = PrefixStore([row(1, 2), row(1, 2, 3, 4), row(7, 8)])
    assert len(store) == 3
    hit, used = store.match([1, 2, 3, 4, 5, 6])
    assert (hit.ids, used) == ((1, 2, 3, 4), 4)
    hit, used = store.match([1, 2, 3, 9])  # diverges inside the longer one: the shorter one it extends
    assert (hit.ids, used) == ((1, 2), 2)
    hit, used = store.match([1, 2, 3, 4])  # all of it is stored: the last token is fed for the next logits
    assert (hit.ids, used) == ((1, 2, 3, 4), 3)
    assert store.match([9, 1, 2]) == (None, 0)
    assert PrefixStore().match([1]) == (None, 0)


def test_reuse_stays_inside_a_sliding_window():
    assert reusable(511, 512) and not reusable(512, 512)
    assert reusable(10_000, None)
