#!/usr/bin/env bash
# Every GPU test and GPU benchmark in one call (under 10 minutes), for a machine with a CUDA device:
#   bash benchmarks/gpu_check.sh            (uses .venv if present, else the machine's python3)
# On a bare machine, first `make device-carry` here and carry .device (packages its image lacks).
# Prints each step's output, then a table: step, result, seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ -d .device ] && export PYTHONPATH="$PYTHONPATH:$PWD/.device"

results=()
step() {  # step NAME COMMAND...: run it, keep its result and time for the table
    local name=$1 began=$SECONDS
    shift
    echo "== $name: $*"
    if "$@"; then results+=("$name|ok|$((SECONDS - began))"); else results+=("$name|FAILED|$((SECONDS - began))"); fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)"
$PY -c "from tidepool.pool import cuda_status; print('tidepool sees', cuda_status())"

# The GPU tests, and the CUDA tier's unit tests over the simulated device next to them (the same
# contract, so a difference between the two is a hole in the simulation).
step "gpu tests" $PY -m pytest -p no:cacheprovider -q -o addopts="" tests/gpu tests/unit/test_cuda_tier.py \
    tests/unit/test_gpu_instance.py
# Allocate+free on the device: the pool on a cache hit against torch.empty and the driver's own.
step "alloc" $PY -m benchmarks.pool alloc --gpu
# The instance's execute path on convnet: POOL=off, the pool, and the pool with torch's allocator
# for the device inputs: throughput, p50/p99, upstream allocations per 1,000 requests.
step "execute" $PY -m benchmarks.pool execute --models convnet --rounds 2 --seconds 4
# A GPU model served by plain tritonserver, where this machine has one (NVIDIA's container does;
# the nvidia-pytriton wheel is too large to carry to a bare machine).
if command -v tritonserver >/dev/null || $PY -c "import pytriton" 2>/dev/null; then
    step "served on the GPU" $PY -m pytest -p no:cacheprovider -q -o addopts="" \
        tests/integration/test_plain_tritonserver.py -k gpu
else
    results+=("served on the GPU|skipped: no tritonserver on this machine|0")
fi

echo
printf '%-22s %-45s %8s\n' step result seconds
status=0
for row in "${results[@]}"; do
    IFS='|' read -r name result seconds <<<"$row"
    printf '%-22s %-45s %8s\n' "$name" "$result" "$seconds"
    [ "$result" = FAILED ] && status=1
done
exit $status
