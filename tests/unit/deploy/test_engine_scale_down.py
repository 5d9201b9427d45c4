"""Autoscaled engines scale down by deletion cost (components/engine-scale-down): the rendered gpu-keda and gpu-hpa
overlays scale a Deployment `engine` whose schedulers keep their pods' deletion cost, with the RBAC, token and
egress that takes; the pod spec is the gpu overlay's StatefulSet's (one spec), the model volume's size still set
once in base/engine.yaml; and the checks see each of those broken."""

from __future__ import annotations

import copy

import pytest

from tests.unit.deploy import deploy_checks as checks
from tests.unit.deploy.deploy_copy import copy_deploy_files
from tests.unit.deploy.scale_down_checks import check_engine_scale_down

SCALED = ("gpu-keda", "gpu-hpa")
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    root = copy_deploy_files(tmp_path_factory.mktemp("deploy"))
    objects = {}
    for overlay in ("gpu", *SCALED):
        objects[overlay], problems = checks.render(root, overlay)
        assert problems == []
    return objects


def engine(objects: list[dict]) -> dict:
    (found,) = [o for o in objects if o["kind"] in ("StatefulSet", "Deployment") and o["metadata"]["name"] == "engine"]
    return found


def scheduler(workload: dict) -> dict:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == "scheduler")


@pytest.mark.parametrize("overlay", SCALED)
def test_the_autoscaler_scales_the_engine_deployment_that_keeps_its_deletion_cost(rendered, overlay):
    objects = rendered[overlay]
    assert check_engine_scale_down(objects) == []
    workload = engine(objects)
    assert workload["kind"] == "Deployment" and "replicas" not in workload["spec"]
    (scaler,) = [o for o in objects if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
                 and o["metadata"]["name"] == "engine"]
    assert scaler["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "engine"}
    env = {v["name"]: v for v in scheduler(workload)["env"]}
    assert env["PAGEDSERVE_POD_DELETION_COST"]["value"] == "true"
    assert env["PAGEDSERVE_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["PAGEDSERVE_POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    config_maps = checks.by_kind(objects, "ConfigMap")
    config = checks.service_config(checks.container_command(scheduler(workload), config_maps),
                                   checks.literal_env(scheduler(workload), config_maps))
    assert config.scale_down.pod_deletion_cost and config.state.redis_url == "redis://redis:6379/0"
    assert config.scale_down.kubernetes_service_account_dir == TOKEN_DIR


@pytest.mark.parametrize("overlay", SCALED)
def test_only_the_scheduler_holds_a_token_of_an_account_that_may_patch_pods_and_nothing_else(rendered, overlay):
    objects = rendered[overlay]
    spec = engine(objects)["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "pagedserve-engine" and spec["automountServiceAccountToken"] is False
    (account,) = [o for o in objects if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == "pagedserve-engine"]
    assert account["automountServiceAccountToken"] is False
    (role,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "pagedserve-engine-deletion-cost"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pagedserve-engine", "namespace": "pagedserve"}]
    holders = [c["name"] for c in spec["containers"] + spec["initContainers"]
               if any(m["mountPath"] == TOKEN_DIR for m in c.get("volumeMounts", []))]
    assert holders == ["scheduler"]


def test_one_engine_spec_the_conversion_adds_only_the_updater(rendered):
    """The autoscaled engine's pod is the gpu overlay's, plus the updater's parts; the model volume has the
    base's claim spec (storage class and size set in one place)."""
    stateful, deployed = engine(rendered["gpu"]), engine(rendered["gpu-keda"])
    assert stateful["kind"] == "StatefulSet"
    (claim,) = stateful["spec"]["volumeClaimTemplates"]
    template = copy.deepcopy(deployed["spec"]["template"])
    volumes = {v["name"]: v for v in template["spec"].pop("volumes")}
    assert volumes.pop("models") == {"name": "models", "ephemeral": {"volumeClaimTemplate": {"spec": claim["spec"]}}}
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "projected" in volumes.pop("kube-api-access")
    assert template["spec"].pop("serviceAccountName") == "pagedserve-engine"
    deployed_scheduler = next(c for c in template["spec"]["containers"] if c["name"] == "scheduler")
    deployed_scheduler["env"] = [v for v in deployed_scheduler["env"] if v["name"] not in (
        "PAGEDSERVE_POD_DELETION_COST", "PAGEDSERVE_POD_NAME", "PAGEDSERVE_POD_NAMESPACE")]
    deployed_scheduler["volumeMounts"] = [m for m in deployed_scheduler["volumeMounts"]
                                          if m["name"] != "kube-api-access"]
    expected = copy.deepcopy(stateful["spec"]["template"])
    expected_volumes = {v["name"]: v for v in expected["spec"].pop("volumes")}
    for spec in (template["spec"], expected["spec"]):  # the patches may reorder them: compare by name
        spec["containers"] = {c["name"]: c for c in spec["containers"]}
    assert template == expected and volumes == expected_volumes
    assert deployed["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0,
                                                                                       "maxUnavailable": 1}}


def test_the_model_volume_size_is_still_set_once(tmp_path):
    root = copy_deploy_files(tmp_path)
    base = root / "deploy/k8s/base/engine.yaml"
    text = base.read_text()
    assert text.count("storage: 40Gi") == 1
    base.write_text(text.replace("storage: 40Gi", "storage: 64Gi"))
    objects, problems = checks.render(root, "gpu-keda")
    assert problems == []
    (models,) = [v for v in engine(objects)["spec"]["template"]["spec"]["volumes"] if v["name"] == "models"]
    assert models["ephemeral"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"] == "64Gi"


def test_a_plain_overlay_runs_no_updater(rendered):
    assert check_engine_scale_down(rendered["gpu"]) == []
    assert all(not v["name"].startswith("PAGEDSERVE_POD_") for v in scheduler(engine(rendered["gpu"]))["env"])
    assert "ServiceAccount" not in {o["kind"] for o in rendered["gpu"]}


def _broken(objects: list[dict], change) -> list[dict]:
    objects = copy.deepcopy(objects)
    change(objects)
    return objects


def _drop(kind: str, name: str):
    return lambda objects: objects.remove(next(o for o in objects
                                               if (o["kind"], o["metadata"]["name"]) == (kind, name)))


def _engine_env_without(name: str):
    def change(objects):
        container = scheduler(engine(objects))
        container["env"] = [v for v in container["env"] if v["name"] != name]
    return change


def _as_statefulset(objects):
    engine(objects)["kind"] = "StatefulSet"
    next(o for o in objects if o["kind"] == "ScaledObject")["spec"]["scaleTargetRef"]["kind"] = "StatefulSet"


def _role_verbs(verbs):
    return lambda objects: next(o for o in objects if o["kind"] == "Role")["rules"][0].update(verbs=verbs)


def _unmount_token(objects):
    container = scheduler(engine(objects))
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "kube-api-access"]


@pytest.mark.parametrize(("change", "expected"), [
    (_as_statefulset, "a StatefulSet ignores pod-deletion-cost"),
    (_engine_env_without("PAGEDSERVE_POD_DELETION_COST"), "does not keep its pod deletion cost"),
    (_engine_env_without("PAGEDSERVE_POD_NAME"), "--pod-name is not its pod's name"),
    (_unmount_token, "no service account token where the scheduler reads it"),
    (_role_verbs(["get", "list"]), "may not patch pods"),
    (_drop("ServiceAccount", "pagedserve-engine"), "which these manifests do not make"),
    (_drop("NetworkPolicy", "engine-kubernetes-api-egress"), "no egress to the Kubernetes API"),
], ids=["statefulset", "updater-off", "pod-name", "token", "role", "account", "egress"])
def test_the_checks_see_each_breakage(rendered, change, expected):
    problems = check_engine_scale_down(_broken(rendered["gpu-keda"], change))
    assert any(expected in p for p in problems), problems


MTLS_KEDA = ["../../components/internal-mtls", "../../components/monitoring", "../../components/autoscaling-keda"]


@pytest.mark.parametrize("components", [MTLS_KEDA, MTLS_KEDA[::-1]], ids=["mtls-first", "keda-first"])
def test_a_component_patching_the_statefulset_applies_in_either_order(tmp_path, components):
    """As the component's header says: internal-mtls (a patch of the StatefulSet) with autoscaling-keda renders
    an autoscaled engine Deployment serving TLS, whichever comes first, and every check of both holds."""
    from tests.unit.deploy import extension_checks

    root = copy_deploy_files(tmp_path)
    overlay = root / "deploy/k8s/overlays/gpu-mtls-keda"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: pagedserve\n"
        f"resources: [../gpu]\ncomponents: [{', '.join(components)}]\n")
    objects, problems = checks.render(root, "gpu-mtls-keda")
    assert problems == []
    workload = engine(objects)
    assert workload["kind"] == "Deployment"
    assert "PAGEDSERVE_INTERNAL_TLS_CERT" in {v["name"] for v in scheduler(workload)["env"]}
    assert check_engine_scale_down(objects) == [] and extension_checks.all_problems(objects) == []
    assert checks.validate_schemas(root, {"gpu-mtls-keda": objects}) == []
