#!/bin/sh
# Installs Tidepool for this Python and lays out its backend beside Triton's Python backend, in two
# steps so that an image caches the first (deploy/Dockerfile); tests/integration/test_deploy.py runs
# both against the bundled tritonserver.
#   install.sh dependencies SOURCE                    torch, the CUDA bindings, the rest of serving's
#   install.sh tidepool SOURCE BACKEND_DIRECTORY      Tidepool itself, and `tidepool install-backend`
#   SOURCE: a copy of the repository's deploy/ (the first step) and pyproject.toml, README.md,
#     requirements.lock and tidepool/ (the second)
#   PYTHON: the interpreter (default python3: in NVIDIA's container, the one its Python stub embeds)
#   CUDA: the torch build and CUDA bindings to pair with the node's driver (docs/pool.md, "Drivers"):
#     cpu (default: a plan without a GPU): torch's CPU build and no bindings; 12 (NVIDIA's 24.10 image
#     is CUDA 12.6; R525-R575 drivers): torch's cu126 build and cuda-python 12.9; 13 (R580 and newer):
#     PyPI's torch, its CUDA 13 build, and cuda-python 13 (the pins are pyproject.toml's extras')
#   PIP_INSTALL_ARGS: more pip flags (the test passes --no-build-isolation --no-index, offline)
set -eu
step=${1:?usage: install.sh dependencies SOURCE | install.sh tidepool SOURCE BACKEND_DIRECTORY}
source=${2:?usage: install.sh dependencies SOURCE | install.sh tidepool SOURCE BACKEND_DIRECTORY}
python=${PYTHON:-python3}
pip="$python -m pip install --no-cache-dir ${PIP_INSTALL_ARGS:-}"
case "$step" in
    dependencies)
        case "${CUDA:-cpu}" in
            cpu) index=https://download.pytorch.org/whl/cpu bindings="" ;;
            12) index=https://download.pytorch.org/whl/cu126 bindings="cuda-python==12.9.10 cuda-bindings==12.9.10" ;;
            13) index="" bindings="cuda-python==13.4.4 cuda-bindings==13.4.4" ;;
            *) echo "install.sh: CUDA must be cpu, 12 or 13, got ${CUDA}" >&2; exit 2 ;;
        esac
        if [ -n "$index" ]; then $pip --index-url "$index" torch==2.13.0; else $pip torch==2.13.0; fi
        $pip -r "$source/deploy/requirements-image.txt" $bindings
        ;;
    tidepool)
        backends=${3:?usage: install.sh tidepool SOURCE BACKEND_DIRECTORY}
        $pip --no-deps "$source"
        "$python" -m tidepool.cli install-backend "$backends" --model-repository /models
        ;;
    *) echo "install.sh: the step must be dependencies or tidepool, got $step" >&2; exit 2 ;;
esac
