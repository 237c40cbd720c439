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
        description="Write a Deployment (non-root, probes, /dev/shm, CPU, memory and GPU from the plans, "
        "spread over nodes), a Service and a headless one for gRPC clients, a PodDisruptionBudget and an "
        "autoscaling/v2 HPA on CPU and each model's queue-to-compute ratio; and in monitoring/ a PodMonitor "
        "for kube-prometheus-stack and prometheus-adapter's values (docs/deploy.md).",
    )
    deploy.add_argument("model_repository", metavar="MODEL_REPOSITORY", help="a planned model repository")
    deploy.add_argument(
        "--image",
        required=True,
        help="where the cluster pulls the image built from deploy/Dockerfile, e.g. "
        "registry.example.com/tidepool-tritonserver:0.2.0",
    )
    deploy.add_argument("--out", default="deploy/kubernetes", metavar="DIR", help="default: %(default)s")
    deploy.add_argument("--name", default=defaults.name, help="objects' name (default: %(default)s)")
    deploy.add_argument("--namespace", default=None, help="default: none (kubectl's current namespace)")
    for bound in ("min", "max"):
        deploy.add_argument(
            f"--{bound}-replicas",
            type=int,
            default=getattr(defaults, f"{bound}_replicas"),
            help="default: %(default)s",
        )
    deploy.add_argument(
        "--target-ratio",
        type=float,
        default=defaults.target_ratio,
        help="a model's queue time over compute time per pod above which the HPA adds replicas "
        "(default: %(default)s)",
    )
    deploy.add_argument(
        "--cpu-target-percent",
        type=int,
        default=defaults.cpu_target_percent,
        help="the pods' CPU, as a share of their request, above which the HPA adds replicas "
        "(default: %(default)s)",
    )
    deploy.add_argument(
        "--pod-start-s",
        type=int,
        default=defaults.pod_start_s,
        help="seconds from a new pod's start to serving, which sets how fast the HPA scales out and how "
        "slowly in (default: %(default)s; benchmarks/autoscale.py measures it)",
    )
    deploy.add_argument(
        "--prometheus-release",
        default=defaults.prometheus_release,
        help="the Helm release of kube-prometheus-stack, whose Prometheus selects PodMonitors labelled "
        "release=<it> (default: %(default)s)",
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
        cpu_target_percent=args.cpu_target_percent,
        namespace=args.namespace,
        prometheus_release=args.prometheus_release,
        pod_start_s=args.pod_start_s,
    )
    needs = pod_needs(Path(args.model_repository))
    for line in needs.describe():
        print(line)
    for path in write_manifests(needs, Path(args.out), settings):
        print(f"wrote {path}")
    # A CPU plan gets torch's CPU build; a GPU plan the build for its nodes' driver (docs/pool.md).
    cuda = "12" if needs.gpus else "cpu"
    build = f"docker build -f deploy/Dockerfile --build-arg CUDA={cuda} -t {args.image} ."
    print(f"the image for this plan: {build}")
    if needs.gpus:
        print("  (CUDA=13 where the GPU nodes' driver is R580 or newer: docs/pool.md, 'Drivers')")
    return 0
