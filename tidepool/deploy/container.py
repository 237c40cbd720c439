"""The container: NVIDIA's tritonserver image with Tidepool installed for its Python, and the one
tritonserver command line it runs. deploy/Dockerfile, the Kubernetes Deployment and the test that
replays the Dockerfile's steps all take the command line from here."""

from __future__ import annotations

from pathlib import Path

# NVIDIA's image of the release Tidepool is tested against: tritonserver 2.51, whose Python stub is
# built for the image's own python3 (3.10).
BASE_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
BACKEND_DIRECTORY = Path("/opt/tritonserver/backends")
MODEL_DIRECTORY = Path("/models")
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
# From SIGTERM to exit: Triton stops taking requests and finishes those in flight for up to this
# long. A pod's terminationGracePeriodSeconds covers it and the preStop pause before it.
EXIT_TIMEOUT_S = 30


def server_command(
    model_repository: Path | str = MODEL_DIRECTORY,
    backend_directory: Path | str = BACKEND_DIRECTORY,
    ports: tuple[int, int, int] = (HTTP_PORT, GRPC_PORT, METRICS_PORT),
) -> list[str]:
    """tritonserver's command line in the container: the repository, the backend directory that
    `tidepool install-backend` laid out, the ports, the drain time; nothing else (no rate limiter:
    planned configs do not assume one)."""
    http, grpc, metrics = ports
    return [
        "tritonserver",
        f"--model-repository={model_repository}",
        f"--backend-directory={backend_directory}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
    ]
