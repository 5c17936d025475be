import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from bridge_ray.checkpoint import (
    CONFIG,
    LATEST,
    MANIFEST,
    CheckpointError,
    CheckpointManager,
    Manifest,
    capture_rng_state,
    checkpoint_root,
    load_manifest,
    restore_rng_state,
)
from bridge_ray.config import load_config


def writer(payload: str):
    def write(directory):
        (directory / "policy").mkdir()
        (directory / "policy" / "weights.bin").write_text(payload)

    return write


def manifest(round_: int) -> Manifest:
    return Manifest(round=round_, policy_version=round_, retriever_version=round_, data_cursor={"epoch": 0, "pos": 8})


def test_save_publishes_a_complete_directory_and_moves_latest(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt", keep=2)
    assert manager.latest() is None
    config = load_config(None, ["run.rounds=7"])
    path = manager.save(manifest(1), writer("one"), config)
    assert path.name == "round-00000001" and manager.latest() == path
    assert (tmp_path / "ckpt" / LATEST).read_text() == path.name
    loaded = load_manifest(path)
    assert (loaded.round, loaded.policy_version, loaded.data_cursor) == (1, 1, {"epoch": 0, "pos": 8})
    assert loaded.files == {CONFIG: (path / CONFIG).stat().st_size, "policy/weights.bin": 3}
    assert load_config(path / CONFIG) == config


def test_keep_prunes_the_oldest(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for r in range(1, 5):
        manager.save(manifest(r), writer(str(r)))
    assert [p.name for p in manager.checkpoints()] == ["round-00000003", "round-00000004"]
    assert manager.latest().name == "round-00000004"


def test_a_writer_that_raises_leaves_the_previous_checkpoint_latest(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3)
    first = manager.save(manifest(1), writer("one"))

    def crash(directory):
        writer("two-partial")(directory)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        manager.save(manifest(2), crash)
    assert manager.latest() == first and load_manifest(first).round == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, first.name], "no partial directory left behind"


def test_a_killed_writer_leaves_the_previous_checkpoint_latest(tmp_path):
    """A process killed mid-write (no cleanup runs) leaves only a hidden staging directory."""
    manager = CheckpointManager(tmp_path, keep=3)
    first = manager.save(manifest(1), writer("one"))
    script = textwrap.dedent(f"""
        import os
        from bridge_ray.checkpoint import CheckpointManager, Manifest
        def write(directory):
            (directory / "policy").mkdir()
            (directory / "policy" / "weights.bin").write_text("half")
            os._exit(9)
        CheckpointManager({str(tmp_path)!r}, keep=3).save(Manifest(2, 2, 2), write)
    """)
    repo = str(Path(__file__).resolve().parents[2])  # this checkout's bridge_ray, whatever is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    assert subprocess.run([sys.executable, "-c", script], env=env, check=False).returncode == 9
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1 and manager.latest() == first
    second = manager.save(manifest(2), writer("two"))
    assert manager.latest() == second and not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())


def test_pointer_lost_after_rename_falls_back_to_newest_complete(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3)
    manager.save(manifest(1), writer("one"))
    second = manager.save(manifest(2), writer("two"))
    (tmp_path / LATEST).write_text("round-00000001-gone")
    (tmp_path / "round-00000009").mkdir()  # no manifest: never a checkpoint
    assert manager.latest() == second


def test_saving_a_round_again_replaces_it(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3)
    manager.save(manifest(3), writer("old"))
    path = manager.save(manifest(3), writer("new"))
    assert (path / "policy" / "weights.bin").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [path.name]


def test_damaged_checkpoints_are_reported_by_file(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3)
    path = manager.save(manifest(1), writer("payload"))
    (path / "policy" / "weights.bin").write_text("pay")
    with pytest.raises(CheckpointError, match=r"weights\.bin: 3 bytes, the manifest says 7"):
        load_manifest(path)
    (path / "policy" / "weights.bin").unlink()
    with pytest.raises(CheckpointError, match=r"weights\.bin: listed in .* but missing"):
        load_manifest(path)
    (path / MANIFEST).write_text(json.dumps({"round": 1, "policy_version": 1, "retriever_versoin": 0}))
    with pytest.raises(CheckpointError, match=r"manifest\.json: unknown keys \['retriever_versoin'\]"):
        load_manifest(path)
    (path / MANIFEST).write_text(json.dumps({"round": "1", "policy_version": 1, "retriever_version": 0}))
    with pytest.raises(CheckpointError, match="round must be a non-negative integer"):
        load_manifest(path)
    (path / MANIFEST).write_text("{")
    with pytest.raises(CheckpointError, match="unreadable manifest"):
        load_manifest(path)


def test_rng_states_round_trip_through_json():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = json.loads(json.dumps(capture_rng_state()))
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_root_defaults_under_the_run_directory():
    assert str(checkpoint_root(load_config(None, ["run.output_dir=runs/x"]))) == "runs/x/checkpoints"
    assert str(checkpoint_root(load_config(None, ["checkpoint.dir=/data/ck"]))) == "/data/ck"
    with pytest.raises(ValueError, match="keep"):
        CheckpointManager("x", keep=0)
