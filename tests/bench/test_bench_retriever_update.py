"""bench retriever-update (Fig. 2b) on the small world: every variant measured in its own process."""

import json

from job_fixtures import LOCAL_CPU

from bridge_ray.cli import main


def test_two_state_adds_its_own_encoder_and_update_to_the_eta_update(tmp_path):
    out = tmp_path / "update.json"
    # a parent whose peak dwarfs the children's, as a long test session's does: the figures must be the children's
    ballast = bytearray(b"\x01") * (1536 * 2**20)
    assert main(["bench", "retriever-update", "--config", str(LOCAL_CPU), "--turns", "4", "--repeats", "1",
                 "--out", str(out), "data.world_size=small", "algorithm.retriever.num_candidates=4"]) == 0
    figures = json.loads(out.read_text())
    mib = 2**20
    del ballast
    for variant in ("bridge", "drop", "two_state"):
        assert figures[variant]["seconds"] > 0 and 100 * mib < figures[variant]["peak_bytes"] < 1536 * mib
        assert figures[variant]["peak_above_start_bytes"] > 30 * mib  # at least the query encoder
        assert 0 < figures[variant]["update_bytes"] < figures[variant]["peak_bytes"]
    # η* loads a second query encoder with its own adapter and optimizer, and runs its own search
    assert figures["two_state"]["update_bytes"] > figures["bridge"]["update_bytes"] + 30 * mib
    # times are reported, never asserted: a 2-core machine is too noisy for a speed ratio
    assert figures["ratios"]["update_bytes"] < 0.6 and figures["ratios"]["seconds"] > 0
    assert out.with_suffix(".png").stat().st_size > 10_000
