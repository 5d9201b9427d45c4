"""The deploy files pass the real tools (kustomize, kubernetes-validate --strict, docker compose config, hadolint,
promtool) and our cross-reference checks; each area is its own test so that a failure names what broke."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.deploy import deploy_checks as checks
from tests.unit.deploy import extension_checks
from tests.unit.deploy.deploy_copy import copy_deploy_files


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return copy_deploy_files(tmp_path_factory.mktemp("deploy"))


@pytest.fixture(scope="module")
def rendered(root) -> dict[str, list[dict]]:
    objects = {}
    for overlay in checks.OVERLAYS:
        objects[overlay], problems = checks.render(root, overlay)
        assert problems == []
    return objects


def test_every_rendered_object_passes_strict_schema_validation(root, rendered):
    assert checks.validate_schemas(root, rendered) == []
    kinds = {obj["kind"] for obj in rendered["gpu"]}
    assert {"Namespace", "StatefulSet", "Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget",
            "HorizontalPodAutoscaler", "Secret", "ConfigMap"} <= kinds
    assert {"ScaledObject", "PodMonitor", "ServiceMonitor", "PrometheusRule"} <= {
        obj["kind"] for obj in rendered["gpu-keda"]}
    assert {"PodMonitor", "ServiceMonitor", "PrometheusRule"} <= {obj["kind"] for obj in rendered["gpu-hpa"]}
    assert {"Certificate", "Issuer"} <= {obj["kind"] for obj in rendered["gpu-mtls"]}
    assert "InferencePool" in {obj["kind"] for obj in rendered["gpu-inference-pool"]}


@pytest.mark.parametrize("overlay", checks.OVERLAYS)
def test_internal_tls_and_inference_pool(rendered, overlay):
    assert extension_checks.all_problems(rendered[overlay]) == []


def test_the_mtls_overlay_serves_tls_and_the_pool_overlay_routes_locally(rendered):
    """The extension checks are not vacuous: each overlay really has what they check."""
    configs = {(pod.name, checks.service_module(c)): cfg for pod, c, cfg in
               extension_checks._service_configs(rendered["gpu-mtls"])}
    assert configs["engine", "pagedserve.services.scheduler"].tls.serves_tls
    assert configs["engine", "pagedserve.services.scheduler"].tls.internal_tls_ca  # mutual: clients must present one
    assert configs["gateway", "pagedserve.services.gateway"].tls.internal_tls_cert
    assert not configs.get(("engine", "pagedserve.services.gateway"))
    pool_configs = {(pod.name, checks.service_module(c)): cfg for pod, c, cfg in
                    extension_checks._service_configs(rendered["gpu-inference-pool"])}
    assert pool_configs["engine", "pagedserve.services.gateway"].scheduler_address == "127.0.0.1:50051"
    assert not any(cfg.tls.serves_tls for cfg in pool_configs.values())


@pytest.mark.parametrize("check", [checks.check_references, checks.check_services, checks.check_probes,
                                   checks.check_images, checks.check_draining, checks.check_commands,
                                   checks.check_network_policies], ids=lambda c: c.__name__)
@pytest.mark.parametrize("overlay", checks.OVERLAYS)
def test_rendered_manifests(rendered, check, overlay):
    assert check(rendered[overlay]) == []


@pytest.mark.parametrize("overlay", checks.OVERLAYS)
def test_security_and_resources(root, rendered, overlay):
    image_user, problems = checks.dockerfile_user(root)
    assert problems == [] and image_user == 10001
    assert checks.check_security(rendered[overlay], image_user) == []
    assert checks.check_resources(rendered[overlay], overlay) == []


def test_engine_replica_is_one_pod_with_scheduler_and_worker(rendered):
    (engine,) = [p for p in checks.pods(rendered["gpu"]) if p.name == "engine"]
    containers = {checks.service_module(c): c for c in engine.containers(init=False)}
    assert set(containers) == {"pagedserve.services.scheduler", "pagedserve.services.gpu_worker"}
    worker = containers["pagedserve.services.gpu_worker"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    (tp_engine,) = [p for p in checks.pods(rendered["gpu-tp"]) if p.name == "engine"]
    tp_worker = next(c for c in tp_engine.containers(init=False) if c["name"] == "gpu-worker")
    assert tp_worker["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert {"name": "PAGEDSERVE_TENSOR_PARALLEL_SIZE", "value": "4"} in tp_worker["env"]
    (cpu_engine,) = [p for p in checks.pods(rendered["cpu"]) if p.name == "engine"]
    assert "nvidia.com/gpu" not in str(cpu_engine.spec)


def test_dockerfile_passes_hadolint(root):
    assert checks.hadolint(root) == []


def test_prometheus_config_passes_promtool_and_dashboard_reads_real_metrics(root):
    assert checks.promtool_config(root) == []
    assert checks.check_dashboard(root) == []
    assert len(checks.dashboard_queries(root)) >= 12


@pytest.mark.parametrize("variant", list(checks.COMPOSE_FILES))
def test_compose_config_resolves_and_connects(root, variant):
    config, problems = checks.compose_config(root, variant)
    assert problems == []
    assert checks.check_compose(config, variant) == []
    assert {"prometheus", "grafana", "jaeger", "redis", "model", "gpu-worker", "scheduler", "gateway"} <= \
        set(config["services"])


@pytest.mark.parametrize("variant", ["gpu-mtls", "cpu-mtls"])
def test_the_compose_mtls_file_makes_every_internal_hop_mutual_tls(root, variant):
    """The TLS checks are not vacuous: with deploy/compose.mtls.yml both hops serve and dial TLS with certificates
    from internal-certs, in the image of the file set (the CPU one with compose.cpu.yml)."""
    config, problems = checks.compose_config(root, variant)
    assert problems == []
    services = config["services"]
    env = {name: services[name]["environment"] for name in ("gpu-worker", "scheduler", "gateway")}
    assert env["gpu-worker"]["PAGEDSERVE_WORKER_TLS"] == env["scheduler"]["PAGEDSERVE_WORKER_TLS"] == "true"
    assert all(e["PAGEDSERVE_INTERNAL_TLS_CA"] and e["PAGEDSERVE_INTERNAL_TLS_CERT"] for e in env.values())
    certs = services["internal-certs"]
    assert certs["image"] == services["gpu-worker"]["image"] == ("pagedserve:0.1.0-cpu" if variant == "cpu-mtls"
                                                                 else "pagedserve:0.1.0")
    assert {"gateway:client", "scheduler:server+client", "gpu-worker:server"} <= set(certs["command"])
    assert "internal-ca" not in str({n: s.get("volumes") for n, s in services.items() if n != "internal-certs"})
    plain, _ = checks.compose_config(root, variant.removesuffix("-mtls"))
    assert "internal-certs" not in plain["services"]  # its profile: off without the mTLS file


def test_compose_publishes_on_every_interface_only_when_asked(root):
    config, _ = checks.compose_config(root, "gpu", env={"PAGEDSERVE_BIND_ADDRESS": "0.0.0.0"})
    assert {p["host_ip"] for p in config["services"]["gateway"]["ports"]} == {"0.0.0.0"}


def test_engine_replicas_are_one_number_and_gateways_find_them_by_dns(root, rendered, tmp_path):
    """The count in kustomization.yaml is the only thing that differs between 2 and 3 engine replicas: gateways
    discover the engines through the headless Service, whatever their number."""
    (engine,) = [o for o in rendered["gpu"] if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "engine"]
    assert engine["spec"]["replicas"] == 2
    scaled_root = copy_deploy_files(tmp_path)
    kustomization = scaled_root / "deploy/k8s/base/kustomization.yaml"
    text = kustomization.read_text()
    assert text.count("count: 2") == 1
    kustomization.write_text(text.replace("count: 2", "count: 3"))
    scaled, problems = checks.render(scaled_root, "gpu")
    assert problems == []
    changed = [(a["kind"], a["metadata"]["name"]) for a, b in zip(rendered["gpu"], scaled, strict=True) if a != b]
    assert changed == [("StatefulSet", "engine")]
    (scaled_engine,) = [o for o in scaled if o["kind"] == "StatefulSet"]
    assert scaled_engine["spec"]["replicas"] == 3 and {**scaled_engine["spec"], "replicas": 2} == engine["spec"]
    (service,) = [o for o in rendered["gpu"] if o["kind"] == "Service" and o["metadata"]["name"] == "engine"]
    assert service["spec"]["clusterIP"] == "None"


def test_compose_reserves_a_gpu_for_each_tensor_parallel_rank(root):
    config, problems = checks.compose_config(root, "gpu", {"PAGEDSERVE_TENSOR_PARALLEL_SIZE": "4"})
    assert problems == [] and checks.check_compose(config, "gpu") == []
    worker = config["services"]["gpu-worker"]
    assert worker["environment"]["PAGEDSERVE_TENSOR_PARALLEL_SIZE"] == "4"
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["count"] == 4
    device["count"] = 1
    assert "compose gpu-worker: reserves [1] GPUs for --tensor-parallel-size 4 (one GPU a rank)" in \
        checks.check_compose(config, "gpu")
