"""Suite-wide fixtures: the tiny policy the job tests share (see ``job_fixtures``), a private Ray instance per
module, disposable run folders, and a small synthetic world indexed once per session with the real MiniLM."""

import os
import shutil
from pathlib import Path

# Three test processes and their actors share 2 cores: an OpenMP thread that spins while it waits for its next
# parallel region (libgomp's default) holds a core another process could use. Set before torch loads libgomp; the
# Ray actors and the `train` processes the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# A test that starts Ray without naming a cluster gets a private one, as `make test` runs modules side by side: Ray
# would otherwise join the cluster another module started with `ray start` (its address in
# /tmp/ray/ray_current_cluster), and fail or disturb it. Tests that join a cluster name its address.
os.environ.setdefault("RAY_ADDRESS", "local")

import pytest
import ray
from job_fixtures import save_protocol_policy, save_tiny_policy

from bridge_ray.cli import main
from bridge_ray.config import load_config
from bridge_ray.data.world import SMALL_SIZE, write_world
from bridge_ray.model_paths import PACKAGED_GEMMA

REPO = Path(__file__).resolve().parents[1]


# The longest modules, in the order they start (the end-to-end modules first): the seconds each took inside `make
# test` (3 test processes on 2 cores; the --durations of its tests, summed). test_server's figure is the CPU-seconds
# of the module run alone; test_export keeps its earlier place. Only the order matters; a module missing here runs
# after these, with the other slow modules. The order was set when the tiny policies carried Gemma's tokenizer;
# with their own the module times shifted (these figures), and the suite stayed balanced: its three workers' summed
# test time was within 4% of three times its wall.
LONGEST_MODULES = [
    "tests/train/test_fault_tolerance.py",  # 79
    "tests/cluster/test_multinode.py",  # 147
    "tests/cluster/test_submit_multinode.py",  # 174
    "tests/policy_learner/test_policy_learner_ranks.py",  # 114
    "tests/agent/test_vllm_e2e.py",  # 121
    "tests/train/test_warmup_stage.py",  # 79
    "tests/train/test_estimators_training.py",  # 169
    "tests/train/test_stages.py",  # 41
    "tests/train/test_training_job.py",  # 36
    "tests/cluster/test_job_submit.py",  # 40
    "tests/warmup/test_trainer.py",  # 33
    "tests/bench/test_bench_estimators.py",  # 55
    "tests/retrieval/test_server.py",  # 87 CPU-s
    "tests/bench/test_bench_landscape.py",  # 31
    "tests/bench/test_bench_trl.py",  # 31
    "tests/bench/test_bench_retriever_update.py",  # 26
    "tests/agent/test_gemma_e2e.py",  # 40
    "tests/commands/test_eval_mirage.py",  # 33
    "tests/bench/test_bench_replay.py",  # 25
    "tests/policy_learner/test_autocast.py",  # 26
    "tests/retrieval/test_export.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first, then the other modules with a ``slow`` test, then the rest; each module's tests
    in their own order.

    ``--dist loadfile`` hands whole modules to the workers in collection order when ``--no-loadscope-reorder``
    is given (``make test`` gives it; by default xdist re-sorts the modules by their number of tests, so the
    end-to-end modules, a few tests each, came last and the suite ended with one worker running them while the
    others sat idle). Started first, the long modules overlap and the short ones fill the gaps.
    """
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
    slow = {module(item) for item in items if item.get_closest_marker("slow")}
    # stable: the order within each module, and of the modules within each group, is kept
    items.sort(key=lambda item: (rank.get(module(item), len(rank)), module(item) not in slow))


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory):
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))


@pytest.fixture(scope="session")
def gemma_vocab_policy(tmp_path_factory):
    """The tiny policy with the packaged Gemma's tokenizer, for the benches that warm it up into searching: its
    262,144-way softmax keeps that warm-up's answers varied where the tiny tokenizer's makes them all agree."""
    return save_tiny_policy(tmp_path_factory.mktemp("gemma-vocab-policy"), tokenizer_from=PACKAGED_GEMMA)


@pytest.fixture(scope="session")
def protocol_policy(tmp_path_factory):
    return save_protocol_policy(tmp_path_factory.mktemp("protocol-policy"))


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    """A folder for one module's shared job run, removed when that module's tests are done.

    A 270M policy's checkpoint is 5 GB (weights plus DeepSpeed's fp32 Adam state); kept until the session ends,
    the job tests' runs add up past what a CI disk has free.
    """
    path = tmp_path_factory.mktemp("module")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def local_ray(request):
    """A private local Ray instance for one test module; other engineers' clusters are left alone.

    Its workers import this checkout's bridge_ray (they inherit PYTHONPATH). A module that needs a given
    cluster size sets ``RAY_CPUS``. The object store holds the 270M policy's weights (1.1 GB) on their way to
    the samplers without spilling to disk, which Ray refuses on a disk over 95% full.
    """
    if ray.is_initialized():
        ray.shutdown()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        mp.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
        start_local_ray(num_cpus=getattr(request.module, "RAY_CPUS", 4))
        yield
        ray.shutdown()


def start_local_ray(num_cpus: int) -> None:
    """``ray.init`` of a local instance, tried twice: Ray gives its raylet a fixed 30 s to register, which a
    2-core machine busy with the other test process can miss ("The current node timed out during startup")."""
    for attempt in (1, 2):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                     object_store_memory=2_500_000_000, log_to_driver=False)
            return
        except Exception as exc:
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
            ray.shutdown()


@pytest.fixture(scope="session")
def minilm_spec():
    return load_config().retrieval.encoder.spec()


@pytest.fixture(scope="session")
def small_world(tmp_path_factory) -> Path:
    return write_world(tmp_path_factory.mktemp("world"), seed=0, size=SMALL_SIZE)


@pytest.fixture(scope="session")
def world_index(tmp_path_factory, small_world) -> Path:
    """The small world's corpus, encoded by the real MiniLM into 2 flat shards through the CLI."""
    out = tmp_path_factory.mktemp("index") / "world"
    rc = main(
        [
            "build-index",
            "--corpus",
            str(small_world / "corpus.jsonl"),
            "--out",
            str(out),
            "--shards",
            "2",
            "--no-progress",
            "--chunk",
            "64",
        ]
    )
    assert rc == 0
    return out


@pytest.fixture(scope="session")
def passage_encoder(minilm_spec):
    from bridge_ray.retrieval.encoder import PassageEncoder

    return PassageEncoder(minilm_spec, device="cpu")
