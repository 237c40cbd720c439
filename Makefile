# Set-up and everyday commands. Every target creates .venv on first use and is quick afterwards.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The torch build and cuda-python that pair with a GPU host's driver (docs/pool.md, "Drivers"):
#   make CUDA=13 ...   R580 and newer drivers: PyPI's torch (its CUDA 13 build), cuda-python 13
#   make CUDA=12 ...   the 12.x line (R525-R575): torch's cu126 build, cuda-python 12.9
# The default, 13, is also what a machine without a GPU takes: the bindings load and find no driver.
CUDA ?= 13
TORCH_INDEX ?= $(if $(filter 12,$(CUDA)),https://download.pytorch.org/whl/cu126,)
STAMP := $(VENV)/.installed-cuda$(CUDA)
HOST ?= 127.0.0.1
REPO ?= model_repository
PYTEST_ARGS ?=

.PHONY: venv serve test test-slow test-gpu device-carry lint perf-analyzer configs clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install --quiet --index-url $(TORCH_INDEX) torch==2.13.0,)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[tools,test,cuda$(CUDA)]'
	rm -f $(VENV)/.installed-cuda*
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/tidepool serve --model-repository $(REPO) --host $(HOST)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -s $(PYTEST_ARGS)

test-gpu: $(STAMP)
	bash benchmarks/gpu_check.sh

# What a bare GPU machine lacks for gpu_check.sh (pure-Python packages its image does not hold),
# in .device/ for the device tool's `carry`.
device-carry: $(STAMP)
	rm -rf .device && mkdir -p .device
	cp -r $$($(BIN)/python -c 'import tritonclient, os; print(os.path.dirname(tritonclient.__file__))') .device/

# The example models' config.pbtxt, profiled and verified on this machine with these budgets (minutes).
configs: $(STAMP)
	$(BIN)/tidepool plan model_repository/encoder --memory-budget 1GiB --latency-budget-ms 100 --verify --write
	$(BIN)/tidepool plan model_repository/convnet --memory-budget 1GiB --latency-budget-ms 250 --verify --write

perf-analyzer: $(STAMP)
	bash benchmarks/common/get_perf_analyzer.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info reports .tools .device
