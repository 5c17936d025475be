"""The cluster files, checked without a cloud: launcher YAMLs against the installed Ray's schema and validator,
KubeRay manifests against the fields of the ray.io/v1 API and our own invariants, the job entrypoints against
the config loader, the runtime env against Ray's packaging, and jobs/submit.sh against a stub ``ray``."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import socket
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from job_fixtures import REPO

from bridge_ray.cli import build_parser
from bridge_ray.config import load_config

LAUNCHERS = [REPO / "clusters/aws.yaml", REPO / "clusters/gcp.yaml"]
RAYCLUSTER = REPO / "clusters/kuberay/raycluster.yaml"
RAYJOB = REPO / "clusters/kuberay/rayjob.yaml"
SHARED = "/mnt/shared"
# Field names of KubeRay's ray.io/v1 API (apis/ray/v1/raycluster_types.go, rayjob_types.go): a typo is an error
# here instead of a field the operator silently drops.
RAYCLUSTER_SPEC = {"suspend", "managedBy", "autoscalerOptions", "headServiceAnnotations", "enableInTreeAutoscaling",
                   "gcsFaultToleranceOptions", "headGroupSpec", "rayVersion", "workerGroupSpecs"}
HEAD_GROUP = {"template", "headService", "enableIngress", "rayStartParams", "serviceType"}
WORKER_GROUP = {"suspend", "groupName", "replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds",
                "rayStartParams", "template", "scaleStrategy", "numOfHosts"}
AUTOSCALER_OPTIONS = {"resources", "image", "imagePullPolicy", "securityContext", "idleTimeoutSeconds",
                      "upscalingMode", "env", "envFrom", "volumeMounts"}
RAYJOB_SPEC = {"activeDeadlineSeconds", "backoffLimit", "rayClusterSpec", "submitterPodTemplate", "metadata",
               "clusterSelector", "submitterConfig", "managedBy", "deletionPolicy", "entrypoint", "runtimeEnvYAML",
               "jobId", "submissionMode", "entrypointResources", "entrypointNumCpus", "entrypointNumGpus",
               "ttlSecondsAfterFinished", "shutdownAfterJobFinishes", "suspend"}


def ray_schema() -> dict:
    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def gpu_pin() -> str:
    """The ray version requirements-gpu.txt pins: every image and rayVersion must match it."""
    return re.search(r"^ray\[[^\]]*\]==(\S+)$", (REPO / "requirements-gpu.txt").read_text(), re.M).group(1)


# ---- cluster launcher ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", LAUNCHERS, ids=lambda p: p.name)
def test_launcher_config_passes_rays_schema_and_validator(path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = load(path)
    jsonschema.validate(config, ray_schema())
    validate_config(prepare_config(copy.deepcopy(config)))  # what `ray up` runs before touching the cloud


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda c: c.update(max_worker=4),                                         # unknown top-level key
        lambda c: c["available_node_types"]["gpu-h100"].update(gpus=8),           # unknown node-type key
        lambda c: c["available_node_types"]["gpu-h100"]["resources"].update(GPU=0.5),  # not an integer
    ],
    ids=["top-level-key", "node-type-key", "fractional-resource"],
)
def test_schema_rejects_corrupted_launcher_config(corrupt):
    config = load(LAUNCHERS[0])
    corrupt(config)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, ray_schema())


@pytest.mark.parametrize("path", LAUNCHERS, ids=lambda p: p.name)
def test_launcher_autoscales_gpu_workers_from_zero_behind_a_cpu_head(path):
    config = load(path)
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--head" in head_start and "--dashboard-host=127.0.0.1" in head_start
    assert f"--num-cpus={head['resources']['CPU']}" in head_start, "declared and started head CPUs differ"
    gpu_types = {name: t for name, t in types.items() if t["resources"].get("GPU", 0) > 0}
    assert len(gpu_types) >= 2
    for name, node_type in gpu_types.items():
        assert node_type.get("min_workers", 0) == 0, name
        assert 0 < node_type["max_workers"] <= config["max_workers"], name
        assert node_type["resources"]["CPU"] > 0 and node_type["resources"]["GPU"] == 8, name
    assert config["idle_timeout_minutes"] > 0
    assert gpu_pin() in config["docker"]["image"]


@pytest.mark.parametrize("path", LAUNCHERS, ids=lambda p: p.name)
def test_launcher_installs_the_gpu_requirements_it_syncs(path):
    config = load(path)
    mounts = config["file_mounts"]
    for remote, local in mounts.items():
        if not local.startswith("~"):
            assert (REPO / local).is_file(), f"file_mounts {remote}: {local} is not in the repo"
    requirements = next(remote for remote, local in mounts.items() if local == "requirements-gpu.txt")
    assert any(re.search(rf"pip install .*-r {re.escape(requirements)}\b", c) for c in config["setup_commands"])
    # Shared storage is mounted on every host and passed into the container at the same path.
    assert f"-v {SHARED}:{SHARED}" in config["docker"]["run_options"]
    for name, node_type in config["available_node_types"].items():
        commands = node_type.get("initialization_commands", config["initialization_commands"])
        assert any("mount " in c and SHARED in c for c in commands), name


# ---- KubeRay --------------------------------------------------------------------------------------------


def check_worker_group(group: dict) -> None:
    """Raise AssertionError unless a worker group is well-formed and asks for GPUs."""
    assert set(group) <= WORKER_GROUP, f"unknown fields {set(group) - WORKER_GROUP}"
    assert group["groupName"]
    low, now, high = group["minReplicas"], group.get("replicas", 0), group["maxReplicas"]
    assert 0 <= low <= now <= high and high > 0, f"{group['groupName']}: replicas {low} <= {now} <= {high}"
    (container,) = group["template"]["spec"]["containers"]
    assert container["image"]
    limits = container["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) > 0 and container["resources"]["requests"] == limits


def check_pods_mount_shared(cluster_spec: dict, claims: set[str]) -> None:
    pods = [cluster_spec["headGroupSpec"]["template"]["spec"]]
    pods += [g["template"]["spec"] for g in cluster_spec["workerGroupSpecs"]]
    for pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == SHARED]
            assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] in claims


def check_pods_read_the_wandb_key(cluster_spec: dict) -> None:
    """Every pod (the coordinator, which logs to W&B, may run on any) takes WANDB_API_KEY from one Secret, optional:
    without it the pods start and the presets log offline."""
    pods = [cluster_spec["headGroupSpec"]["template"]["spec"]]
    pods += [g["template"]["spec"] for g in cluster_spec["workerGroupSpecs"]]
    refs = [next(e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == "WANDB_API_KEY")
            for pod in pods for container in pod["containers"]]
    assert refs and all(ref == {"name": "bridge-ray-wandb", "key": "api_key", "optional": True} for ref in refs), refs


def check_cluster_spec(spec: dict) -> None:
    assert set(spec) <= RAYCLUSTER_SPEC, f"unknown fields {set(spec) - RAYCLUSTER_SPEC}"
    assert spec["rayVersion"] == gpu_pin()
    head = spec["headGroupSpec"]
    assert set(head) <= HEAD_GROUP
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"  # the head Service's only way in
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    (container,) = head["template"]["spec"]["containers"]
    assert container["image"] and "nvidia.com/gpu" not in container["resources"]["limits"]
    for group in spec["workerGroupSpecs"]:
        check_worker_group(group)


def test_raycluster_autoscales_gpu_groups_from_zero_on_shared_storage():
    docs = list(yaml.safe_load_all(RAYCLUSTER.read_text()))
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["metadata"]["name"]
    spec = cluster["spec"]
    check_cluster_spec(spec)
    assert spec["enableInTreeAutoscaling"] is True
    assert set(spec["autoscalerOptions"]) <= AUTOSCALER_OPTIONS
    groups = spec["workerGroupSpecs"]
    assert len(groups) >= 2 and len({g["groupName"] for g in groups}) == len(groups)
    assert all(g["minReplicas"] == 0 and g["replicas"] == 0 for g in groups)
    check_pods_mount_shared(spec, claims)
    check_pods_read_the_wandb_key(spec)
    (pvc,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize(
    "corrupt",
    [lambda g: g.update(replicas=3), lambda g: g.update(maxReplica=2), lambda g: g.update(maxReplicas=0)],
    ids=["replicas-above-max", "misspelt-field", "max-zero"],
)
def test_worker_group_check_rejects_corrupted_group(corrupt):
    (cluster,) = [d for d in yaml.safe_load_all(RAYCLUSTER.read_text()) if d["kind"] == "RayCluster"]
    group = cluster["spec"]["workerGroupSpecs"][0]
    check_worker_group(group)
    corrupt(group)
    with pytest.raises(AssertionError):
        check_worker_group(group)


def test_rayjob_trains_a_repo_config_on_its_own_cluster():
    job = load(RAYJOB)
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob") and job["metadata"]["name"]
    spec = job["spec"]
    assert set(spec) <= RAYJOB_SPEC, f"unknown fields {set(spec) - RAYJOB_SPEC}"
    assert spec["submissionMode"] in {"K8sJobMode", "HTTPMode"}
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    check_cluster_spec(spec["rayClusterSpec"])
    check_pods_mount_shared(spec["rayClusterSpec"], {"bridge-ray-shared"})
    check_pods_read_the_wandb_key(spec["rayClusterSpec"])
    claims = {d["metadata"]["name"] for d in yaml.safe_load_all(RAYCLUSTER.read_text())
              if d["kind"] == "PersistentVolumeClaim"}
    assert claims == {"bridge-ray-shared"}, "rayjob.yaml mounts the PVC raycluster.yaml creates"

    words = shlex.split(spec["entrypoint"])
    assert words[:4] == ["python", "-m", "bridge_ray", "train"]
    args = build_parser().parse_args(words[3:])  # the real command line: flags, config, overrides
    assert args.auto_resume, "re-applying the RayJob continues the run"
    assert (REPO / args.config).is_file()
    config = load_config(REPO / args.config, args.overrides)  # every override is a valid key and value
    paths = [config.run.output_dir, config.retrieval.index.dir, *config.data.train, *config.data.eval.values()]
    assert all(str(p).startswith(f"{SHARED}/") for p in paths), paths

    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    # Ray's own validation of keys and types; it also wants the working dir to exist: this checkout stands in.
    ray.runtime_env.RuntimeEnv(**{**runtime_env, "working_dir": str(REPO)})
    workdir = re.search(r"^WORKDIR (\S+)$", (REPO / "clusters/Dockerfile").read_text(), re.M).group(1)
    assert runtime_env["working_dir"] == workdir, "the working dir is the code baked into the image"


def test_images_run_the_pinned_ray_version():
    dockerfile = (REPO / "clusters/Dockerfile").read_text()
    assert re.search(rf"^FROM rayproject/ray:{re.escape(gpu_pin())}-py311-gpu$", dockerfile, re.M)
    assert "requirements-gpu.txt" in dockerfile
    assert ray.__version__ == gpu_pin(), "the CPU and GPU sets pin different Ray versions"


# ---- jobs/ ----------------------------------------------------------------------------------------------


def test_runtime_env_uploads_code_and_configs_only(tmp_path):
    from ray._private.runtime_env.packaging import create_package

    runtime_env = load(REPO / "jobs/runtime_env.yaml")
    ray.runtime_env.RuntimeEnv(**runtime_env)
    assert not {"pip", "uv", "conda"} & set(runtime_env), "the nodes already have requirements-gpu.txt"
    tree = tmp_path / "checkout"
    kept = ["bridge_ray/data/world.py", "bridge_ray/agent/templates/few_shot.txt", "jobs/configs/a.yaml",
            "README.md"]
    dropped = [".venv/lib/torch.so", ".git/objects/pack.pack", "runs/x/checkpoints/round-1/model.safetensors",
               "wandb/run/files.txt", "data/nq_test.jsonl", "indexes/wiki18/shard-0/embeddings.npy",
               "bridge_ray/__pycache__/cli.cpython-311.pyc", "model.gguf", "bridge_ray/ckpt.pt"]
    for name in kept + dropped:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("x")
    package = tmp_path / "package.zip"
    create_package(str(tree), package, include_gitignore=False, excludes=runtime_env["excludes"])
    files = {n for n in zipfile.ZipFile(package).namelist() if not n.endswith("/")}
    assert files == set(kept)


class Dashboard(ThreadingHTTPServer):
    """A stand-in for a Ray head's dashboard: answers ``GET /api/version`` with ``status`` and keeps the
    Authorization header of each request in ``seen``."""

    status = 200

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), DashboardHandler)
        self.seen: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class DashboardHandler(BaseHTTPRequestHandler):
    server: Dashboard

    def do_GET(self) -> None:
        self.server.seen.append(self.headers.get("Authorization"))
        ok = self.path == "/api/version" and self.server.status == 200
        body = b'{"version": "4", "ray_version": "2.60.0"}' if ok else b"no"
        self.send_response(self.server.status if self.path == "/api/version" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def dashboard() -> Iterator[Dashboard]:
    server = Dashboard()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def stub_ray(tmp_path, dashboard):
    """A ``ray`` on PATH that records its arguments, one per line, then RAY_AUTH_MODE, and copies the runtime env
    file it is given to ``ray-args.env`` (the script removes its own); RAY_ADDRESS is the stand-in dashboard; no
    token and no secret anywhere."""
    bin_dir, record = tmp_path / "bin", tmp_path / "ray-args"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" "mode=$RAY_AUTH_MODE" > {record}\n'
        f'prev=; for a; do [ "$prev" = --runtime-env ] && cp "$a" {record}.env; prev=$a; done\n'
    )
    (bin_dir / "ray").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path)}
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "WANDB_API_KEY", "HF_TOKEN"):
        env.pop(name, None)
    return env | {"RAY_ADDRESS": dashboard.url}, record


def submitted_runtime_env(record: Path) -> dict:
    """The runtime env the stub was given: jobs/runtime_env.yaml, plus any secrets, in a file since removed."""
    args = record.read_text().splitlines()
    assert not Path(args[args.index("--runtime-env") + 1]).exists(), "the runtime env file (secrets) is removed"
    return load(Path(f"{record}.env"))


def submit(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "jobs/submit.sh"), *args], env=env, cwd="/", capture_output=True, text=True)


def test_submit_script_wraps_ray_job_submit(stub_ray, dashboard):
    env, record = stub_ray
    result = submit(env, "--no-wait", "jobs/configs/local_cpu.yaml", "--resume", "data.eval={a: /x y/z.jsonl}")
    assert result.returncode == 0, result.stderr
    assert dashboard.seen == [None], "the cluster is asked first, without a token when none is at hand"
    *args, mode = record.read_text().splitlines()
    assert mode == "mode="
    job_id = args[args.index("--submission-id") + 1]
    assert f"ray job logs --address {dashboard.url} --follow {job_id}" in result.stdout
    assert args[: args.index("--")] == [
        "job", "submit", "--address", dashboard.url, "--submission-id", job_id,
        "--working-dir", ".", "--runtime-env", args[args.index("--runtime-env") + 1], "--no-wait",
    ]
    assert submitted_runtime_env(record) == load(REPO / "jobs/runtime_env.yaml")
    assert args[args.index("--") + 1:] == [
        "python", "-m", "bridge_ray", "train", "--config", "jobs/configs/local_cpu.yaml",
        "--resume", "data.eval={a: /x y/z.jsonl}",
    ]
    assert "run.output_dir" in result.stderr, "a run without an explicit output dir gets the shared-storage note"


def test_submit_script_sends_the_token_when_one_is_at_hand(stub_ray, dashboard):
    env, record = stub_ray
    result = submit({**env, "RAY_AUTH_TOKEN": "secret"}, "jobs/configs/local_cpu.yaml", "run.output_dir=/mnt/x")
    assert result.returncode == 0, result.stderr
    assert dashboard.seen == ["Bearer secret"]
    assert record.read_text().splitlines()[-1] == "mode=token"
    assert "--no-wait" not in record.read_text().splitlines() and "run.output_dir" not in result.stderr


def test_submit_script_passes_the_wandb_and_hf_keys_when_set(stub_ray):
    env, record = stub_ray
    key = 'k"ey\\with: odd # chars'
    result = submit({**env, "WANDB_API_KEY": key, "HF_TOKEN": "hf_abc"}, "jobs/configs/local_cpu.yaml")
    assert result.returncode == 0, result.stderr
    expected = load(REPO / "jobs/runtime_env.yaml")
    expected["env_vars"] |= {"WANDB_API_KEY": key, "HF_TOKEN": "hf_abc"}
    assert submitted_runtime_env(record) == expected
    assert key not in result.stdout + result.stderr


def test_index_job_goes_through_the_same_submit_path(stub_ray, dashboard, tmp_path):
    env, record = stub_ray
    token_file = tmp_path / "token"
    token_file.write_text("t")
    env |= {"CORPUS": "/mnt/wiki18.jsonl", "OUT": "/mnt/indexes/wiki18", "HF_TOKEN": "hf_abc",
            "RAY_AUTH_TOKEN_PATH": str(token_file)}
    result = subprocess.run([str(REPO / "jobs/build_index_wiki18.sh")], env=env, cwd="/", capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    *args, mode = record.read_text().splitlines()
    assert mode == "mode=token" and "ray get-auth-token" in result.stdout
    assert dashboard.seen == ["Bearer t"], "the token file's token"
    assert args[args.index("--submission-id") + 1].startswith("bridge-build-index-wiki18-")
    assert args[args.index("--") - 2 : args.index("--")] == ["--entrypoint-num-gpus", "1"]
    assert args[args.index("--") + 1 :][:8] == [
        "python", "-m", "bridge_ray", "build-index", "--corpus", "/mnt/wiki18.jsonl", "--out", "/mnt/indexes/wiki18",
    ]
    runtime_env = submitted_runtime_env(record)
    assert runtime_env["env_vars"]["HF_TOKEN"] == "hf_abc" and "/indexes/" in runtime_env["excludes"]
    missing = subprocess.run([str(REPO / "jobs/build_index_wiki18.sh")], env={**env, "CORPUS": ""}, cwd="/",
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "set CORPUS" in missing.stderr


@pytest.mark.parametrize("args", [(), ("--no-wait",), ("--resume",), ("jobs/configs/missing.yaml",)])
def test_submit_script_refuses_bad_arguments(stub_ray, args):
    env, record = stub_ray
    result = submit(env, *args)
    assert result.returncode == 2 and "usage: jobs/submit.sh" in result.stderr
    assert not record.exists()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_refused_before_submitting(result: subprocess.CompletedProcess, record: Path, says: str) -> None:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and len(errors) == 1 and says in errors[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout and "submission id" not in result.stdout, result
    assert not record.exists(), "ray job submit never ran"


@pytest.mark.parametrize("script", ["jobs/submit.sh", "jobs/build_index_wiki18.sh"])
def test_no_cluster_at_the_address_is_one_error_line(stub_ray, script):
    env, record = stub_ray
    address = f"http://127.0.0.1:{closed_port()}"
    env |= {"RAY_ADDRESS": address, "CORPUS": "/mnt/wiki18.jsonl", "OUT": "/mnt/indexes/wiki18"}
    args = ["jobs/configs/local_cpu.yaml", "run.output_dir=/mnt/x"] if script == "jobs/submit.sh" else []
    result = subprocess.run([str(REPO / script), *args], env=env, cwd="/", capture_output=True, text=True)
    assert_refused_before_submitting(result, record, f"no Ray cluster answers at {address}")


@pytest.mark.parametrize(("status", "says"), [(401, "refused the request (HTTP 401)"),
                                              (404, "answers HTTP 404 to /api/version, not as a Ray dashboard")])
def test_a_dashboard_that_refuses_is_one_error_line(stub_ray, dashboard, status, says):
    env, record = stub_ray
    dashboard.status = status
    assert_refused_before_submitting(submit(env, "jobs/configs/local_cpu.yaml"), record, says)
