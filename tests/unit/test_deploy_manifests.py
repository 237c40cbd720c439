"""The Kubernetes manifests `tidepool deploy-manifests` renders: valid against Kubernetes' own
schemas (strict), and right where a schema cannot tell: probes on the server's health paths and
port, /dev/shm as a memory emptyDir, resources equal to what the plans say, the HPA's metric the one
the adapter rule serves, the PodMonitor aimed at the metrics port. Also what sizing reads from a
config, the container's CPU quota, and the scaling signal's arithmetic."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tidepool.clients.metrics import Sample
from tidepool.configfile import ModelInstanceGroup, copy_model, read_config
from tidepool.deploy import container
from tidepool.deploy.manifests import DeploySettings, Renderer, render
from tidepool.deploy.scaling import COMPUTE_US, QUEUE_US, SIGNAL, queue_to_compute_ratio
from tidepool.deploy.sizing import MIB, SHM_FLOOR_BYTES, STUB_BYTES, DeployError, pod_needs
from tidepool.machine import cgroup_cpu_limit
from tidepool.testing import MODEL_REPOSITORY

COMMITTED = MODEL_REPOSITORY.parent / "deploy" / "kubernetes"
KUBERNETES = kubernetes_validate.utils.latest_version()


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict]:
    return {
        name: yaml.safe_load(text)
        for name, text in render(pod_needs(MODEL_REPOSITORY), DeploySettings()).items()
    }


def mebibytes(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity.removesuffix("Mi")) * MIB


def test_every_object_but_the_pod_monitor_is_valid_in_strict_mode(rendered):
    validated = []
    for manifest in rendered.values():
        if manifest["kind"] == "PodMonitor":  # a CRD: no schema; its own test below
            continue
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
        validated.append(manifest["kind"])
    assert sorted(validated) == [
        "ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"
    ]  # fmt: skip


def test_strict_validation_does_catch_a_misspelt_field(rendered):
    deployment = yaml.safe_load(yaml.safe_dump(rendered["deployment.yaml"]))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def server_container(rendered) -> dict:
    [server] = rendered["deployment.yaml"]["spec"]["template"]["spec"]["containers"]
    return server


def test_probes_ask_the_servers_health_endpoints_on_its_http_port(rendered):
    server = server_container(rendered)
    ports = {port["name"]: port["containerPort"] for port in server["ports"]}
    assert ports == {
        "http": container.HTTP_PORT,
        "grpc": container.GRPC_PORT,
        "metrics": container.METRICS_PORT,
    }
    paths = {
        kind: server[kind]["httpGet"]["path"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")
    }
    assert paths == {"startupProbe": "/v2/health/ready", "readinessProbe": "/v2/health/ready",
                     "livenessProbe": "/v2/health/live"}  # fmt: skip
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert ports[server[kind]["httpGet"]["port"]] == container.HTTP_PORT
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # a slow load is not killed


def test_the_container_runs_the_servers_command_line_and_drains_within_its_grace_period(rendered):
    server = server_container(rendered)
    assert server["args"] == container.server_command()
    pod = rendered["deployment.yaml"]["spec"]["template"]["spec"]
    pause = int(server["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > container.EXIT_TIMEOUT_S + pause


def test_dev_shm_is_a_memory_volume_sized_from_the_plan(rendered):
    needs = pod_needs(MODEL_REPOSITORY)
    pod = rendered["deployment.yaml"]["spec"]["template"]["spec"]
    [mount] = server_container(rendered)["volumeMounts"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert mount["mountPath"] == "/dev/shm"
    assert volume["emptyDir"]["medium"] == "Memory"
    assert mebibytes(volume["emptyDir"]["sizeLimit"]) == needs.shm_bytes >= SHM_FLOOR_BYTES


def test_resources_are_what_the_plans_say(rendered):
    needs = pod_needs(MODEL_REPOSITORY)
    resources = server_container(rendered)["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == str(needs.cores)
    assert mebibytes(resources["requests"]["memory"]) == needs.memory_request_bytes
    assert mebibytes(resources["limits"]["memory"]) == needs.memory_limit_bytes
    assert "nvidia.com/gpu" not in resources["limits"]
    # Each example's plan: 2 instances, a pool limit of 512 MiB each, for 2 cores.
    for model in needs.models:
        config = read_config(MODEL_REPOSITORY / model.name / "config.pbtxt")
        assert model.instances == sum(group.count for group in config.instance_group)
        assert model.pool_limit_bytes == int(config.parameters["POOL_LIMIT_BYTES"].string_value)
    assert needs.memory_limit_bytes >= sum(
        m.instances * (STUB_BYTES + m.pool_limit_bytes) for m in needs.models
    )
    # The request holds one execution per instance, activations included, from the plan's memory
    # fit: more than the pool's floor, which holds only the gathered inputs and outputs.
    convnet = next(m for m in needs.models if m.name == "convnet")
    assert convnet.execution_bytes > convnet.pool_initial_bytes > 0
    per_instance = STUB_BYTES + convnet.static_bytes + convnet.execution_bytes
    assert convnet.request_bytes == convnet.instances * per_instance


def test_the_hpa_scales_on_the_metric_the_adapter_rule_serves(rendered):
    hpa = rendered["horizontalpodautoscaler.yaml"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == rendered["deployment.yaml"]["metadata"]["name"]
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    [rule] = yaml.safe_load(rendered["prometheus-adapter-rules.yaml"]["data"]["config.yaml"])["rules"]
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"] == SIGNAL
    assert rule["seriesQuery"].startswith(QUEUE_US) and COMPUTE_US in rule["metricsQuery"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_the_pod_monitor_scrapes_the_metrics_port_of_the_deployments_pods(rendered):
    monitor = rendered["podmonitor.yaml"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    pod_labels = rendered["deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {port["name"] for port in server_container(rendered)["ports"]}
    assert set(endpoint) <= {"port", "path", "interval"}


def test_the_service_and_disruption_budget_select_the_deployments_pods(rendered):
    pod_labels = rendered["deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert rendered["service.yaml"]["spec"]["selector"].items() <= pod_labels.items()
    assert (
        rendered["poddisruptionbudget.yaml"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    )


def test_the_committed_manifests_are_those_of_the_committed_configs():
    for name, text in render(pod_needs(MODEL_REPOSITORY), DeploySettings()).items():
        assert (COMMITTED / name).read_text() == text, (
            f"deploy/kubernetes/{name} is stale: run `tidepool deploy-manifests model_repository`"
        )


def gpu_copy(tmp_path: Path) -> Path:
    config = read_config(MODEL_REPOSITORY / "encoder" / "config.pbtxt")
    del config.instance_group[:]
    config.instance_group.add(count=1, kind=ModelInstanceGroup.KIND_GPU)
    copy_model(MODEL_REPOSITORY / "encoder", tmp_path / "repository" / "encoder", config)
    return tmp_path / "repository"


def test_a_gpu_instance_asks_for_a_gpu(tmp_path):
    needs = pod_needs(gpu_copy(tmp_path))
    assert needs.gpus == 1
    limits = Renderer(needs, DeploySettings()).resources()["limits"]
    assert limits["nvidia.com/gpu"] == "1"


def test_a_config_without_a_pool_limit_is_refused_with_what_to_do(tmp_path):
    repository = gpu_copy(tmp_path)
    config = read_config(repository / "encoder" / "config.pbtxt")
    config.parameters.pop("POOL_LIMIT_BYTES")
    copy_model(repository / "encoder", tmp_path / "other" / "encoder", config)
    with pytest.raises(DeployError, match="no POOL_LIMIT_BYTES.*tidepool plan"):
        pod_needs(tmp_path / "other")


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"min_replicas": 0}, "--min-replicas"), ({"min_replicas": 3, "max_replicas": 2}, "--max-replicas"),
     ({"name": "Tide_pool"}, "--name"), ({"target_ratio": 0}, "--target-ratio")],
)  # fmt: skip
def test_bad_settings_are_refused_with_the_flag_named(settings, message):
    with pytest.raises(DeployError, match=message):
        DeploySettings(**settings)


@pytest.mark.parametrize(
    ("files", "expected"),
    [({"cpu.max": "200000 100000\n"}, 2.0), ({"cpu.max": "150000 100000"}, 1.5),
     ({"cpu.max": "max 100000"}, None),
     ({"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"}, 3.0),
     ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None), ({}, None)],
)  # fmt: skip
def test_the_cgroup_cpu_quota_is_read_from_v2_then_v1(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_limit(tmp_path) == expected


def test_usable_cores_never_exceed_the_quota_rounded_up(monkeypatch):
    from tidepool import machine

    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda root=None: 1.5)
    assert machine.usable_cores() == 2
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda root=None: None)
    assert machine.usable_cores() == 64


def samples(queue_us: dict[str, float], compute_us: dict[str, float]) -> list[Sample]:
    return [Sample(QUEUE_US, {"model": m}, v) for m, v in queue_us.items()] + [
        Sample(COMPUTE_US, {"model": m}, v) for m, v in compute_us.items()
    ]


def test_the_signal_weighs_models_by_their_time_not_one_vote_each():
    before = samples({"a": 0, "b": 0}, {"a": 0, "b": 0})
    # a: waits 3 s per 1 s of compute (saturated); b: a trickle that never waits.
    after = samples({"a": 3_000_000, "b": 0}, {"a": 1_000_000, "b": 10_000})
    ratio = queue_to_compute_ratio(before, after, elapsed_s=10)
    assert ratio == pytest.approx(3_000_000 / 1_010_000)  # not (3 + 0) / 2
    assert queue_to_compute_ratio(before, before, elapsed_s=10) == 0.0  # idle: 0, not a division by zero
