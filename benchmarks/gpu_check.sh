#!/usr/bin/env bash
# Every GPU check in one call, each step under its own timeout (under 10 minutes in all), for a
# machine with a CUDA device:
#   bash benchmarks/gpu_check.sh            (uses .venv if present, else the machine's python3)
# On a bare machine, first `make device-carry` here and carry .device (packages its image lacks).
# The device steps (benchmarks/common/gpu_check.py) also run in `make test` on the simulated device.
# Prints each step's output and verdicts, then a table: step, result, seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ -d .device ] && export PYTHONPATH="$PYTHONPATH:$PWD/.device"

results=()
step() {  # step NAME SECONDS COMMAND...: run it under a timeout, keep its result and time for the table
    local name=$1 limit=$2 began=$SECONDS
    shift 2
    echo "== $name: $*"
    timeout "$limit" "$@"
    local status=$?
    if [ $status -eq 0 ]; then results+=("$name|ok|$((SECONDS - began))")
    elif [ $status -eq 124 ]; then results+=("$name|FAILED: over its ${limit} s|$((SECONDS - began))")
    else results+=("$name|FAILED|$((SECONDS - began))"); fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)"
$PY -c "from tidepool.pool import cuda_status; print('tidepool sees', cuda_status())"

# On the device, what the simulated one claims: staging and cross-stream reuse with a stream kept
# busy, every output of back-to-back executions (host and device outputs), no upstream allocation
# after warm-up, reserved memory across a synchronize and trim, a typed OOM past the limit.
step "device steps" 180 $PY -m benchmarks.common.gpu_check
# The GPU tests, and the CUDA tier's tests over the simulated device next to them (the same
# contract, so a difference between the two is a hole in the simulation).
step "gpu tests" 180 $PY -m pytest -p no:cacheprovider -q -o addopts="" tests/gpu tests/unit/test_cuda_tier.py \
    tests/unit/test_stream_order.py tests/unit/test_gpu_instance.py
# Allocate+free on the device: the pool on a cache hit against torch.empty and the driver's own.
step "alloc" 90 $PY -m benchmarks.pool alloc --gpu --quick
# The execute path on convnet on the GPU: POOL=off, the pool, the pool with torch's allocator for
# the device inputs: throughput (the pool's goal: 1.3x POOL=off), p50/p99, upstream allocations.
step "execute convnet" 120 $PY -m benchmarks.pool execute --models convnet --rounds 2 --seconds 3
# A GPU model served by plain tritonserver, where this machine has one (NVIDIA's container does;
# the nvidia-pytriton wheel is too large to carry to a bare machine).
if command -v tritonserver >/dev/null || $PY -c "import pytriton" 2>/dev/null; then
    step "served on the GPU" 120 $PY -m pytest -p no:cacheprovider -q -o addopts="" \
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
    [[ "$result" == FAILED* ]] && status=1
done
exit $status
