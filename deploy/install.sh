#!/bin/sh
# Installs Tidepool for this Python and lays out its backend beside Triton's Python backend. The
# image's build runs it (deploy/Dockerfile); tests/integration/test_deploy.py runs it against the
# bundled tritonserver.  Usage: install.sh SOURCE BACKEND_DIRECTORY
#   SOURCE: a copy of the repository's pyproject.toml, README.md, requirements.lock and tidepool/
#   PYTHON: the interpreter (default python3: in NVIDIA's container, the one its Python stub embeds)
#   CUDA: the torch build and CUDA bindings to pair with the node's driver (docs/pool.md, "Drivers"):
#     12 (default: NVIDIA's 24.10 image is CUDA 12.6; R525-R575 drivers): torch's cu126 build and
#     cuda-python 12.9; 13 (R580 and newer): PyPI's torch, its CUDA 13 build, and cuda-python 13;
#     cpu: torch's CPU build and no CUDA bindings
#   CONSTRAINTS: a pip constraints file. Unset in the image: requirements.lock is resolved for
#     Python 3.11 and the image's Python is 3.10, so there pip pins the direct dependencies only
#     (pyproject.toml's, numpy<2 among them) and resolves the rest for 3.10.
#   PIP_INSTALL_ARGS: more pip flags (the test passes --no-build-isolation --no-index, offline)
set -eu
source=${1:?usage: install.sh SOURCE BACKEND_DIRECTORY}
backends=${2:?usage: install.sh SOURCE BACKEND_DIRECTORY}
python=${PYTHON:-python3}
case "${CUDA:-12}" in
    12) index=https://download.pytorch.org/whl/cu126 extra="[cuda12]" ;;
    13) index="" extra="[cuda13]" ;;
    cpu) index=https://download.pytorch.org/whl/cpu extra="" ;;
    *) echo "install.sh: CUDA must be 12, 13 or cpu, got ${CUDA}" >&2; exit 2 ;;
esac
pip="$python -m pip install --no-cache-dir ${PIP_INSTALL_ARGS:-}"
# torch first, from the index of its build, so that Tidepool's own torch==2.13.0 is then satisfied.
[ -z "$index" ] || $pip --index-url "$index" torch==2.13.0
$pip ${CONSTRAINTS:+-c "$CONSTRAINTS"} "$source$extra"
"$python" -m tidepool.cli install-backend "$backends" --model-repository /models
