"""`tidepool deploy-manifests`: Kubernetes manifests whose resources follow the planned configs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add(commands: Any) -> None:
    from tidepool.deploy.manifests import DeploySettings

    defaults = DeploySettings()
    deploy = commands.add_parser(
        "deploy-manifests",
        help="render Kubernetes manifests whose resources follow the repository's planned configs",
        description="Write a Deployment (probes, /dev/shm, CPU, memory and GPU from the plans), a "
        "Service, a PodDisruptionBudget, a PodMonitor, an autoscaling/v2 HPA on the queue-to-compute "
        "ratio and the prometheus-adapter rule that serves it (docs/deploy.md).",
    )
    deploy.add_argument("model_repository", metavar="MODEL_REPOSITORY", help="a planned model repository")
    deploy.add_argument("--out", default="deploy/kubernetes", metavar="DIR", help="default: %(default)s")
    deploy.add_argument("--name", default=defaults.name, help="objects' name (default: %(default)s)")
    deploy.add_argument(
        "--image", default=defaults.image, help="built from deploy/Dockerfile (default: %(default)s)"
    )
    deploy.add_argument("--namespace", default=None, help="default: none (kubectl's current namespace)")
    deploy.add_argument(
        "--min-replicas", type=int, default=defaults.min_replicas, help="default: %(default)s"
    )
    deploy.add_argument(
        "--max-replicas", type=int, default=defaults.max_replicas, help="default: %(default)s"
    )
    deploy.add_argument(
        "--target-ratio",
        type=float,
        default=defaults.target_ratio,
        help="queue time over compute time per pod above which the HPA adds replicas (default: %(default)s)",
    )
    deploy.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tidepool.deploy.manifests import DeploySettings, write_manifests
    from tidepool.deploy.sizing import pod_needs

    settings = DeploySettings(
        name=args.name,
        image=args.image,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        target_ratio=args.target_ratio,
        namespace=args.namespace,
    )
    needs = pod_needs(Path(args.model_repository))
    for line in needs.describe():
        print(line)
    for path in write_manifests(needs, Path(args.out), settings):
        print(f"wrote {path}")
    return 0
