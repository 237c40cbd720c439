"""The Kubernetes objects that run a model repository on a cluster, rendered from its planned
configs: a Deployment of the container (non-root, probes, /dev/shm, resources from the plan,
spread over nodes), a Service and a headless one for gRPC clients that balance per request, a
PodDisruptionBudget, an autoscaling/v2 HPA on CPU and each model's queue-to-compute ratio; and, in
monitoring/ (they need the Prometheus operator's CRDs or live in the monitoring namespace), a
PodMonitor labelled for kube-prometheus-stack and prometheus-adapter's values for the ratio. Plain
manifests rather than a Helm chart: the resources are arithmetic over the configs, which Python
does once here instead of Go templates redoing it; kustomize or `kubectl apply -f` take them as
they are."""

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
# NVIDIA's image has the user `triton-server`, uid and gid 1000 (its own Helm chart runs as it).
TRITON_UID = 1000
PLACEHOLDER_IMAGE = f"REGISTRY/tidepool-tritonserver:{__version__}"
CPU_TARGET_PERCENT = 60  # the HPA keeps the pods' CPU under this share of their request
DEFAULT_RELEASE = "kube-prometheus-stack"
# The Prometheus Service kube-prometheus-stack makes when installed under its default release name.
DEFAULT_PROMETHEUS = {"url": "http://kube-prometheus-stack-prometheus.monitoring.svc", "port": 9090}
ADAPTER_HEADER = [
    "Helm values of prometheus-community/prometheus-adapter, installed in its own namespace:",
    "  helm upgrade --install prometheus-adapter prometheus-community/prometheus-adapter \\",
    "    -n monitoring -f THIS_FILE",
    "another Prometheus: --set prometheus.url=http://ITS-SERVICE.ITS-NAMESPACE.svc (docs/deploy.md)",
]


@dataclass(frozen=True)
class DeploySettings:
    """What the user chooses; everything else follows the plan."""

    name: str = "tidepool"
    image: str = PLACEHOLDER_IMAGE  # where the cluster pulls the image built from deploy/Dockerfile
    min_replicas: int = 2  # the PodDisruptionBudget keeps one of them while a node drains
    max_replicas: int = 8
    target_ratio: float = 1.0  # queue-to-compute ratio per pod and model that the HPA keeps under
    cpu_target_percent: int = CPU_TARGET_PERCENT
    namespace: str | None = None
    # kube-prometheus-stack selects PodMonitors by `release: <its Helm release>`.
    prometheus_release: str = DEFAULT_RELEASE
    pod_start_s: int = 60  # from a new pod's start to its models serving (benchmarks/autoscale.py)

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
        if not 1 <= self.cpu_target_percent <= 100:
            raise DeployError(f"--cpu-target-percent must be 1-100, got {self.cpu_target_percent}")
        if self.pod_start_s < 1:
            raise DeployError(f"--pod-start-s must be at least 1, got {self.pod_start_s}")


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

    def probe_timeout_s(self) -> int:
        """Every stub of the pod shares its CPU limit with the server's HTTP threads: a probe waits
        longer where more instances take turns on fewer cores (and never less than 3 s)."""
        instances = sum(model.instances for model in self.needs.models)
        return max(3, min(10, 2 * -(-instances // max(1, self.needs.cores))))

    def deployment(self) -> Manifest:
        ports = [
            {"name": "http", "containerPort": container.HTTP_PORT},
            {"name": "grpc", "containerPort": container.GRPC_PORT},
            {"name": "metrics", "containerPort": container.METRICS_PORT},
        ]
        timeout_s = self.probe_timeout_s()

        def probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
            return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s,
                    "timeoutSeconds": timeout_s, "failureThreshold": failures}  # fmt: skip

        server = {
            "name": "tritonserver",
            "image": self.settings.image,
            "args": container.server_command(),
            "ports": ports,
            # A read-only root: the caches torch and its libraries keep go to /tmp.
            "env": [{"name": "HOME", "value": "/tmp"}],
            "startupProbe": probe(HEALTH_READY, STARTUP_PERIOD_S, STARTUP_FAILURES),
            "readinessProbe": probe(HEALTH_READY, 5, 3),
            "livenessProbe": probe(HEALTH_LIVE, 10, 3),
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_PAUSE_S)]}}},
            "resources": self.resources(),
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"}],
        }
        pod: dict[str, Any] = {
            "terminationGracePeriodSeconds": container.EXIT_TIMEOUT_S + PRESTOP_PAUSE_S + 5,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": TRITON_UID,
                "runAsGroup": TRITON_UID,
                "fsGroup": TRITON_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            # Two replicas on one node are one node's failure away from none.
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "labelSelector": self.selector(),
                                "topologyKey": "kubernetes.io/hostname",
                            },
                        }
                    ]
                }
            },
            "containers": [server],
            "volumes": [
                {
                    "name": "dshm",
                    "emptyDir": {"medium": "Memory", "sizeLimit": _quantity_mib(self.needs.shm_bytes)},
                },
                {"name": "tmp", "emptyDir": {}},
            ],
        }
        if self.needs.gpus:  # GPU nodes are commonly tainted so that only GPU pods land there
            pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        # No `replicas`: the HPA owns the count, and a re-apply after re-planning must not reset it.
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self.metadata(),
            "spec": {
                "selector": self.selector(),
                "template": {"metadata": {"labels": dict(self.labels)}, "spec": pod},
            },
        }

    def service(self, headless: bool = False) -> Manifest:
        """The Service; `headless`: one with no virtual IP, whose DNS name lists every ready pod, for
        gRPC clients that balance per request (`dns:///NAME-headless:8001`, round_robin): a gRPC
        channel through the virtual IP stays on the pod it first reached."""
        spec: dict[str, Any] = {
            "selector": dict(self.labels),
            "ports": [
                {"name": name, "port": port, "targetPort": name}
                for name, port in (
                    ("http", container.HTTP_PORT),
                    ("grpc", container.GRPC_PORT),
                    ("metrics", container.METRICS_PORT),
                )
            ],
        }
        if headless:
            spec["clusterIP"] = "None"
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.metadata(f"{self.settings.name}-headless" if headless else None),
            "spec": spec,
        }

    def disruption_budget(self) -> Manifest:
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": self.metadata(),
            "spec": {"maxUnavailable": 1, "selector": self.selector()},
        }

    def pod_monitor(self) -> Manifest:
        metadata = self.metadata()
        metadata["labels"]["release"] = self.settings.prometheus_release
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": metadata,
            "spec": {
                "selector": self.selector(),
                "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
            },
        }

    def autoscaler(self) -> Manifest:
        """On the larger of: CPU against the request, which grows with load from the first request;
        and each model's queue-to-compute ratio, a guard at saturation. Scaling out is fast (a new
        pod takes pod_start_s to serve), scaling in slow (several pod starts, one pod a minute)."""
        cpu = {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": self.settings.cpu_target_percent}}}  # fmt: skip
        queues = [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": SIGNAL, "selector": {"matchLabels": {"model": model.name}}},
                    "target": {"type": "AverageValue", "averageValue": _milli(self.settings.target_ratio)},
                },
            }  # fmt: skip
            for model in self.needs.models
        ]
        start = self.settings.pod_start_s
        return {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": self.metadata(),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": self.settings.name},
                "minReplicas": self.settings.min_replicas,
                "maxReplicas": self.settings.max_replicas,
                "metrics": [cpu, *queues],
                "behavior": {
                    "scaleUp": {
                        "stabilizationWindowSeconds": 0,
                        "selectPolicy": "Max",
                        "policies": [
                            {"type": "Percent", "value": 100, "periodSeconds": start},
                            {"type": "Pods", "value": 2, "periodSeconds": start},
                        ],
                    },
                    "scaleDown": {
                        "stabilizationWindowSeconds": max(300, 5 * start),
                        "policies": [
                            {"type": "Pods", "value": 1, "periodSeconds": 60},
                        ],
                    },
                },  # fmt: skip
            },
        }

    def adapter_values(self) -> dict[str, Any]:
        """prometheus-adapter's Helm values that serve SIGNAL per pod and model, installed in the
        adapter's own namespace (it reads its rules only from there)."""
        values: dict[str, Any] = {"rules": {"default": False, "custom": [AdapterRule().as_dict()]}}
        if self.settings.prometheus_release == DEFAULT_RELEASE:
            values["prometheus"] = dict(DEFAULT_PROMETHEUS)
        return values

    def files(self) -> dict[str, Any]:
        """File name -> what it holds; monitoring/ needs the Prometheus operator's CRDs or goes to
        the adapter's namespace, so the rest applies without either."""
        return {
            "deployment.yaml": self.deployment(),
            "service.yaml": self.service(),
            "service-headless.yaml": self.service(headless=True),
            "poddisruptionbudget.yaml": self.disruption_budget(),
            "horizontalpodautoscaler.yaml": self.autoscaler(),
            "monitoring/podmonitor.yaml": self.pod_monitor(),
            "monitoring/prometheus-adapter-values.yaml": self.adapter_values(),
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
        lines = header if manifest.get("kind") == "Deployment" else header[:1]
        if name.endswith("prometheus-adapter-values.yaml"):
            lines = [*lines[:1], *ADAPTER_HEADER]
        rendered[name] = "".join(f"# {line}\n" for line in lines) + dump(manifest)
    return rendered


def write_manifests(needs: PodNeeds, out: Path, settings: DeploySettings) -> list[Path]:
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render(needs, settings).items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
