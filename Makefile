# rlvr: the two set-up commands of the README.
#   make demo  - create .venv if missing, install, run the arithmetic demo end to end
#   make test  - create .venv if missing, install with the dev extras, run the whole test suite
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

.PHONY: setup setup-dev demo test clean gpu-wheels

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.torch: | $(VENV)/bin/python
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
	touch $@

setup: $(VENV)/.torch
	$(PIP) install -q -e .

setup-dev: $(VENV)/.torch
	$(PIP) install -q -e ".[dev]"

demo: setup
	$(VENV)/bin/rlvr demo

test: setup-dev
	$(PY) -m pytest -q

gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d $(GPU_WHEELS) $(GPU_WHEEL_SPECS)
	@ls $(GPU_WHEELS)

clean:
	rm -rf runs examples/arith/assets
