#!/usr/bin/env bash
# Every GPU test and GPU benchmark in one call, for a machine with a CUDA device:
#   bash benchmarks/gpu_check.sh            (uses .venv if present, else the machine's python3)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)"
status=0
$PY -m pytest -p no:cacheprovider -m gpu tests/gpu -q -o addopts="" || status=1
$PY -m benchmarks.pool_gpu || status=1
exit $status
