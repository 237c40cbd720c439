"""The Kubernetes objects that run a model repository on a cluster, rendered from its planned
configs: a Deployment of the container (probes, /dev/shm, resources from the plan), a Service, a
PodDisruptionBudget, a PodMonitor for /metrics, an autoscaling/v2 HPA on the queue-to-compute ratio,
and the prometheus-adapter rule that serves that ratio. Plain manifests rather than a Helm chart:
the resources are arithmetic over the configs, which Python does once here instead of Go templates
redoing it; kustomize or `kubectl apply -f` take the output as it is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tidepool import __version__
from tidepool.deploy import container
from tidepool.deploy.scaling import SIGNAL, AdapterRule
from tidepool.deploy.sizing import MIB, DeployError, PodNeeds

Manifest = dict[str, Any]

HEALTH_LIVE, HEALTH_READY = "/v2/health/live", "/v2/health/ready"
# A model loads in tens of seconds on 2 cores (torch import, warm-up passes); allow 5 minutes
# before the startup probe gives up, so a slow load is not killed and restarted (and again).
STARTUP_PERIOD_S, STARTUP_FAILURES = 5, 60
# Before SIGTERM reaches the server, the pod leaves the Service's endpoints; this pause lets
# the proxies see that before the server stops taking requests.
PRESTOP_PAUSE_S = 5


@dataclass(frozen=True)
class DeploySettings:
    """What the user chooses; everything else follows the plan."""

    name: str = "tidepool"
    image: str = f"tidepool-tritonserver:{__version__}"
    min_replicas: int = 2  # the PodDisruptionBudget keeps one of them while a node drains
    max_replicas: int = 8
    target_ratio: float = 1.0  # queue-to-compute ratio per pod that the HPA keeps replicas under
    namespace: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum() or self.name != self.name.lower():
            raise DeployError(f"--name must be lower-case letters, digits and '-', got {self.name!r}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise DeployError(
                f"replicas: need 1 <= --min-replicas <= --max-replicas, got {self.min_replicas} and "
                f"{self.max_replicas}"
            )
        if self.target_ratio <= 0:
            raise DeployError(f"--target-ratio must be above 0, got {self.target_ratio}")


class _Dumper(yaml.SafeDumper):
    """Block style for text of several lines (the adapter's config), and long lines kept whole."""


_Dumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar(
        "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None
    ),
)


def dump(document: Any) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1000)


def _quantity_mib(size: int) -> str:
    return f"{size // MIB}Mi"


def _milli(value: float) -> str:
    return f"{round(value * 1000)}m"


class Renderer:
    """The objects for one model repository's pod needs and the user's settings."""

    def __init__(self, needs: PodNeeds, settings: DeploySettings) -> None:
        self.needs = needs
        self.settings = settings
        self.labels = {"app.kubernetes.io/name": "tidepool", "app.kubernetes.io/instance": settings.name}

    def metadata(self, name: str | None = None) -> dict[str, Any]:
        found: dict[str, Any] = {"name": name or self.settings.name, "labels": dict(self.labels)}
        if self.settings.namespace:
            found["namespace"] = self.settings.namespace
        return found

    def selector(self) -> dict[str, dict[str, str]]:
        return {"matchLabels": dict(self.labels)}

    def resources(self) -> dict[str, dict[str, str]]:
        needs = self.needs
        # CPU request = limit = the cores the plan was made for: the container then sees exactly
        # those (tidepool reads the cgroup's quota), and the pod gets Guaranteed QoS when memory
        # matches too.
        requests = {"cpu": str(needs.cores), "memory": _quantity_mib(needs.memory_request_bytes)}
        limits = {"cpu": str(needs.cores), "memory": _quantity_mib(needs.memory_limit_bytes)}
        if needs.gpus:
            limits["nvidia.com/gpu"] = str(needs.gpus)
        return {"requests": requests, "limits": limits}

    def deployment(self) -> Manifest:
        ports = [
            {"name": "http", "containerPort": container.HTTP_PORT},
            {"name": "grpc", "containerPort": container.GRPC_PORT},
            {"name": "metrics", "containerPort": container.METRICS_PORT},
        ]

        def probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
            return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s,
                    "failureThreshold": failures}  # fmt: skip

        server = {
            "name": "tritonserver",
            "image": self.settings.image,
            "args": container.server_command(),
            "ports": ports,
            "startupProbe": probe(HEALTH_READY, STARTUP_PERIOD_S, STARTUP_FAILURES),
            "readinessProbe": probe(HEALTH_READY, 5, 3),
            "livenessProbe": probe(HEALTH_LIVE, 10, 3),
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_PAUSE_S)]}}},
            "resources": self.resources(),
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        }
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self.metadata(),
            "spec": {
                "replicas": self.settings.min_replicas,
                "selector": self.selector(),
                "template": {
                    "metadata": {"labels": dict(self.labels)},
                    "spec": {
                        "terminationGracePeriodSeconds": container.EXIT_TIMEOUT_S + PRESTOP_PAUSE_S + 5,
                        "containers": [server],
                        "volumes": [
                            {
                                "name": "dshm",
                                "emptyDir": {
                                    "medium": "Memory",
                                    "sizeLimit": _quantity_mib(self.needs.shm_bytes),
                                },
                            }
                        ],  # fmt: skip
                    },
                },
            },
        }

    def service(self) -> Manifest:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.metadata(),
            "spec": {
                "selector": dict(self.labels),
                "ports": [
                    {"name": name, "port": port, "targetPort": name}
                    for name, port in (
                        ("http", container.HTTP_PORT),
                        ("grpc", container.GRPC_PORT),
                        ("metrics", container.METRICS_PORT),
                    )
                ],  # fmt: skip
            },
        }

    def disruption_budget(self) -> Manifest:
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": self.metadata(),
            "spec": {"maxUnavailable": 1, "selector": self.selector()},
        }

    def pod_monitor(self) -> Manifest:
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": self.metadata(),
            "spec": {
                "selector": self.selector(),
                "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
            },
        }

    def autoscaler(self) -> Manifest:
        return {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": self.metadata(),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": self.settings.name},
                "minReplicas": self.settings.min_replicas,
                "maxReplicas": self.settings.max_replicas,
                "metrics": [
                    {
                        "type": "Pods",
                        "pods": {
                            "metric": {"name": SIGNAL},
                            "target": {
                                "type": "AverageValue",
                                "averageValue": _milli(self.settings.target_ratio),
                            },
                        },
                    }
                ],  # fmt: skip
                # A new replica loads its models for tens of seconds before it serves: scale down
                # slowly so a short lull does not undo a scale-up that is still loading.
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
            },
        }

    def adapter_rules(self) -> Manifest:
        rules = {"rules": [AdapterRule().as_dict()]}
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.metadata(f"{self.settings.name}-prometheus-adapter-rules"),
            "data": {"config.yaml": dump(rules)},
        }

    def files(self) -> dict[str, Manifest]:
        """File name -> the object it holds."""
        return {
            "deployment.yaml": self.deployment(),
            "service.yaml": self.service(),
            "poddisruptionbudget.yaml": self.disruption_budget(),
            "podmonitor.yaml": self.pod_monitor(),
            "horizontalpodautoscaler.yaml": self.autoscaler(),
            "prometheus-adapter-rules.yaml": self.adapter_rules(),
        }


def render(needs: PodNeeds, settings: DeploySettings) -> dict[str, str]:
    """File name -> YAML text, each opening with what the plan says the pod needs."""
    header = [
        "Rendered by `tidepool deploy-manifests` from the planned configs; render again after re-planning.",
        *needs.describe(),
    ]
    rendered = {}
    for name, manifest in Renderer(needs, settings).files().items():
        # The deployment carries the sizing; the others say where they came from.
        lines = header if manifest["kind"] == "Deployment" else header[:1]
        rendered[name] = "".join(f"# {line}\n" for line in lines) + dump(manifest)
    return rendered


def write_manifests(needs: PodNeeds, out: Path, settings: DeploySettings) -> list[Path]:
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render(needs, settings).items():
        path = out / name
        path.write_text(text)
        written.append(path)
    return written
