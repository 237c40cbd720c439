#!/bin/sh
# Installs Tidepool for this Python and lays out its backend beside Triton's Python backend. The
# image's build runs it (deploy/Dockerfile); tests/integration/test_deploy.py runs it against the
# bundled tritonserver.  Usage: install.sh SOURCE BACKEND_DIRECTORY
#   SOURCE: a copy of the repository's pyproject.toml, README.md, requirements.lock and tidepool/
#   PYTHON: the interpreter (default python3: in NVIDIA's container, the one its Python stub embeds)
#   CONSTRAINTS: a pip constraints file. Unset in the image: requirements.lock is resolved for
#     Python 3.11 and the image's Python is 3.10, so there pip pins the direct dependencies only
#     (pyproject.toml's, numpy<2 among them) and resolves the rest for 3.10.
#   PIP_INSTALL_ARGS: more pip flags (the test passes --no-build-isolation --no-index, offline)
set -eu
source=${1:?usage: install.sh SOURCE BACKEND_DIRECTORY}
backends=${2:?usage: install.sh SOURCE BACKEND_DIRECTORY}
python=${PYTHON:-python3}
"$python" -m pip install --no-cache-dir ${PIP_INSTALL_ARGS:-} ${CONSTRAINTS:+-c "$CONSTRAINTS"} "$source"
"$python" -m tidepool.cli install-backend "$backends" --model-repository /models
