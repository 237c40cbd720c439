"""The Kubernetes manifests `tidepool deploy-manifests` renders: valid against Kubernetes' own
schemas (strict), and right where a schema cannot tell: probes on the server's health paths and
port, /dev/shm as a memory emptyDir, resources equal to what the plans say, the HPA's metric the one
the adapter rule serves, the PodMonitor aimed at the metrics port. Also what sizing reads from a
config, the container's CPU quota, and the scaling signal's arithmetic."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tidepool.clients.metrics import Sample
from tidepool.configfile import ModelInstanceGroup, copy_model, read_config
from tidepool.deploy import container
from tidepool.deploy.manifests import DeploySettings, Renderer, render
from tidepool.deploy.scaling import COMPUTE_US, QUEUE_US, SIGNAL, queue_to_compute_ratio
from tidepool.deploy.sizing import CUDA_HOST_BYTES, MIB, SHM_FLOOR_BYTES, STUB_BYTES, DeployError, pod_needs
from tidepool.machine import cgroup_cpu_limit
from tidepool.testing import MODEL_REPOSITORY

ROOT = MODEL_REPOSITORY.parent
COMMITTED = ROOT / "deploy" / "kubernetes"
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


def test_every_kubernetes_object_is_valid_in_strict_mode_and_needs_no_crd(rendered):
    validated = []
    for name, manifest in rendered.items():
        if name.startswith("monitoring/"):  # a CRD's object and Helm values: their own tests below
            continue
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
        validated.append(manifest["kind"])
    # `kubectl apply -f deploy/kubernetes/` (not recursive) then works on a cluster without the
    # Prometheus operator.
    assert sorted(validated) == [
        "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service", "Service"
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
    [mount] = [m for m in server_container(rendered)["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
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


def test_the_hpa_scales_on_cpu_and_on_each_models_ratio_as_the_adapter_serves_it(rendered):
    hpa = rendered["horizontalpodautoscaler.yaml"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == rendered["deployment.yaml"]["metadata"]["name"]
    cpu, *queues = hpa["spec"]["metrics"]
    assert cpu == {"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": DeploySettings().cpu_target_percent}}}  # fmt: skip
    models = sorted(m.name for m in pod_needs(MODEL_REPOSITORY).models)
    assert len(models) == 2
    assert sorted(q["pods"]["metric"]["selector"]["matchLabels"]["model"] for q in queues) == models
    [rule] = rendered["monitoring/prometheus-adapter-values.yaml"]["rules"]["custom"]
    for queue in queues:
        assert queue["type"] == "Pods" and queue["pods"]["target"] == {
            "type": "AverageValue",
            "averageValue": "1000m",
        }
        assert queue["pods"]["metric"]["name"] == rule["name"]["as"] == SIGNAL
    # The selector's `model` label reaches the query through <<.LabelMatchers>>, and the query keeps
    # it by grouping on it: a series per pod and model.
    assert rule["seriesQuery"].startswith(QUEUE_US) and COMPUTE_US in rule["metricsQuery"]
    assert rule["metricsQuery"].count("by (<<.GroupBy>>, model)") == 2
    assert rule["metricsQuery"].count("{<<.LabelMatchers>>}") == 2
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_scaling_out_is_fast_and_in_slow_at_the_pace_of_a_pods_start():
    settings = DeploySettings(pod_start_s=120)
    behavior = Renderer(pod_needs(MODEL_REPOSITORY), settings).autoscaler()["spec"]["behavior"]
    up, down = behavior["scaleUp"], behavior["scaleDown"]
    assert up["stabilizationWindowSeconds"] == 0 and up["selectPolicy"] == "Max"
    assert {p["periodSeconds"] for p in up["policies"]} == {120}  # at most double per pod start
    assert down["stabilizationWindowSeconds"] == 600 > 300  # not the default: five pod starts
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]


def test_no_replicas_beside_the_hpa(rendered):
    # A re-apply after re-planning must not reset a scaled-out Deployment.
    assert "replicas" not in rendered["deployment.yaml"]["spec"]


def test_the_pod_meets_the_restricted_pod_security_standard(rendered):
    pod = rendered["deployment.yaml"]["spec"]["template"]["spec"]
    server = server_container(rendered)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000  # NVIDIA's image's triton-server user
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert server["securityContext"]["allowPrivilegeEscalation"] is False
    assert server["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # A read-only root, with /tmp (HOME too) writable for the caches torch keeps.
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    [tmp] = [v for v in pod["volumes"] if v["name"] == mounts["/tmp"]]
    assert "emptyDir" in tmp and {"name": "HOME", "value": "/tmp"} in server["env"]


def test_probe_timeouts_grow_with_instances_per_core():
    needs = pod_needs(MODEL_REPOSITORY)  # 4 instances on 2 cores
    assert Renderer(needs, DeploySettings()).probe_timeout_s() == 4
    crowded = replace(needs, models=tuple(replace(m, instances=8, cores=1) for m in needs.models))
    assert Renderer(crowded, DeploySettings()).probe_timeout_s() == 10  # capped
    alone = replace(needs, models=(replace(needs.models[0], instances=1),))
    assert Renderer(alone, DeploySettings()).probe_timeout_s() == 3  # never Kubernetes' 1 s default


def test_replicas_prefer_different_nodes(rendered):
    pod = rendered["deployment.yaml"]["spec"]["template"]
    affinity = pod["spec"]["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity  # one node still schedules
    [term] = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    )


def test_the_pod_monitor_carries_the_stacks_release_label_and_scrapes_the_metrics_port(rendered):
    monitor = rendered["monitoring/podmonitor.yaml"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    # kube-prometheus-stack's Prometheus selects PodMonitors by `release: <its Helm release>`.
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    other = Renderer(pod_needs(MODEL_REPOSITORY), DeploySettings(prometheus_release="prom")).pod_monitor()
    assert other["metadata"]["labels"]["release"] == "prom"
    pod_labels = rendered["deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {port["name"] for port in server_container(rendered)["ports"]}
    assert set(endpoint) <= {"port", "path", "interval"}


def test_the_adapter_rule_is_helm_values_for_the_adapters_own_namespace():
    needs = pod_needs(MODEL_REPOSITORY)
    texts = render(needs, DeploySettings(namespace="shop"))
    values = yaml.safe_load(texts["monitoring/prometheus-adapter-values.yaml"])
    # Values of the adapter's chart, not an object in the app's namespace, where the adapter never
    # reads; its header says to install it into the adapter's namespace.
    assert set(values) == {"rules", "prometheus"} and values["rules"]["default"] is False
    # kube-prometheus-stack's Prometheus under its default release name; another release: none.
    assert values["prometheus"] == {
        "url": "http://kube-prometheus-stack-prometheus.monitoring.svc",
        "port": 9090,
    }
    other = Renderer(needs, DeploySettings(prometheus_release="prom")).adapter_values()
    assert "prometheus" not in other
    assert "shop" not in texts["monitoring/prometheus-adapter-values.yaml"]
    assert "helm upgrade --install prometheus-adapter" in texts["monitoring/prometheus-adapter-values.yaml"]
    assert yaml.safe_load(texts["deployment.yaml"])["metadata"]["namespace"] == "shop"
    assert yaml.safe_load(texts["monitoring/podmonitor.yaml"])["metadata"]["namespace"] == "shop"


def test_the_headless_service_lists_the_pods_for_per_request_grpc_balancing(rendered):
    headless = rendered["service-headless.yaml"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == rendered["service.yaml"]["spec"]["selector"]
    assert {p["name"] for p in headless["spec"]["ports"]} >= {"grpc", "http"}


def test_the_service_and_disruption_budget_select_the_deployments_pods(rendered):
    pod_labels = rendered["deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert rendered["service.yaml"]["spec"]["selector"].items() <= pod_labels.items()
    assert (
        rendered["poddisruptionbudget.yaml"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    )


def test_the_committed_manifests_are_those_of_the_committed_configs():
    rendered = render(pod_needs(MODEL_REPOSITORY), DeploySettings())
    committed = {str(p.relative_to(COMMITTED)) for p in COMMITTED.rglob("*.yaml")}
    assert committed == set(rendered), "deploy/kubernetes/ holds files it no longer renders"
    for name, text in rendered.items():
        assert (COMMITTED / name).read_text() == text, (
            f"deploy/kubernetes/{name} is stale: run `tidepool deploy-manifests model_repository`"
        )


def gpu_copy(tmp_path: Path) -> Path:
    config = read_config(MODEL_REPOSITORY / "encoder" / "config.pbtxt")
    del config.instance_group[:]
    config.instance_group.add(count=1, kind=ModelInstanceGroup.KIND_GPU)
    copy_model(MODEL_REPOSITORY / "encoder", tmp_path / "repository" / "encoder", config)
    return tmp_path / "repository"


def test_a_gpu_instance_asks_for_a_gpu_tolerates_gpu_nodes_and_counts_cudas_host_side(tmp_path):
    needs = pod_needs(gpu_copy(tmp_path))
    assert needs.gpus == 1
    renderer = Renderer(needs, DeploySettings())
    assert renderer.resources()["limits"]["nvidia.com/gpu"] == "1"
    pod = renderer.deployment()["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    kubernetes_validate.validate(renderer.deployment(), KUBERNETES, strict=True)
    cpu_plan = pod_needs(MODEL_REPOSITORY)
    assert "tolerations" not in Renderer(cpu_plan, DeploySettings()).deployment()["spec"]["template"]["spec"]
    [encoder] = needs.models
    on_cpu = replace(encoder, gpu_instances=0)
    assert encoder.request_bytes - on_cpu.request_bytes == CUDA_HOST_BYTES
    assert encoder.limit_bytes - on_cpu.limit_bytes == CUDA_HOST_BYTES


def test_a_config_without_a_pool_limit_is_refused_with_what_to_do(tmp_path):
    repository = gpu_copy(tmp_path)
    config = read_config(repository / "encoder" / "config.pbtxt")
    config.parameters.pop("POOL_LIMIT_BYTES")
    copy_model(repository / "encoder", tmp_path / "other" / "encoder", config)
    with pytest.raises(DeployError, match="no POOL_LIMIT_BYTES.*tidepool plan"):
        pod_needs(tmp_path / "other")


def test_the_image_is_a_required_flag(tmp_path, capsys):
    from tidepool.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["deploy-manifests", str(MODEL_REPOSITORY), "--out", str(tmp_path)])
    assert exited.value.code == 2 and "--image" in capsys.readouterr().err
    assert (
        main(["deploy-manifests", str(MODEL_REPOSITORY), "--out", str(tmp_path), "--image", "r.io/t:1"]) == 0
    )
    assert "image: r.io/t:1" in (tmp_path / "deployment.yaml").read_text()
    assert "--build-arg CUDA=cpu -t r.io/t:1" in capsys.readouterr().out


def test_the_images_pins_are_pyprojects():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies = project["dependencies"]
    image = [line for line in (ROOT / "deploy" / "requirements-image.txt").read_text().splitlines()
             if line and not line.startswith("#")]  # fmt: skip
    assert sorted(image) == sorted(d.split("#")[0].strip() for d in dependencies if not d.startswith("torch"))
    script = (ROOT / "deploy" / "install.sh").read_text()
    [torch] = [d for d in dependencies if d.startswith("torch==")]
    assert script.count(torch) >= 2
    for extra in ("cuda12", "cuda13"):
        assert " ".join(project["optional-dependencies"][extra]) in script


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"min_replicas": 0}, "--min-replicas"), ({"min_replicas": 3, "max_replicas": 2}, "--max-replicas"),
     ({"name": "Tide_pool"}, "--name"), ({"target_ratio": 0}, "--target-ratio"),
     ({"cpu_target_percent": 0}, "--cpu-target-percent"), ({"pod_start_s": 0}, "--pod-start-s")],
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


def test_per_model_a_heavy_model_cannot_hide_a_light_models_queue():
    before = samples({"heavy": 0, "light": 0}, {"heavy": 0, "light": 0})
    # heavy: long computes that never wait; light: waits twice its short compute.
    after = samples({"heavy": 0, "light": 200_000}, {"heavy": 9_000_000, "light": 100_000})
    assert queue_to_compute_ratio(before, after, elapsed_s=10) < 0.05  # summed: hidden
    assert queue_to_compute_ratio(before, after, elapsed_s=10, model="light") == pytest.approx(2.0)
    assert queue_to_compute_ratio(before, after, elapsed_s=10, model="heavy") == 0.0
