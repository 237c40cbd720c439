#!/usr/bin/env bash
# Every GPU test and GPU benchmark in one call, for a machine with a CUDA device:
#   bash benchmarks/gpu_check.sh            (uses .venv if present, else the machine's python3)
# On a bare machine, first `make device-carry` here and carry .device (packages its image lacks).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ -d .device ] && export PYTHONPATH="$PYTHONPATH:$PWD/.device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)"
status=0
$PY -m pytest -p no:cacheprovider -m gpu tests/gpu -q -o addopts="" || status=1
$PY -m benchmarks.pool_gpu || status=1
$PY -m benchmarks.instance_on_off --rounds 1 --seconds 4 || status=1  # the pool's effect on the GPU path
exit $status
