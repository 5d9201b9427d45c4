"""Checks of engine scale-down in rendered overlays (components/engine-scale-down): an engine an autoscaler scales
is a Deployment (a StatefulSet removes its highest ordinal and ignores controller.kubernetes.io/pod-deletion-cost)
whose schedulers keep their pods' deletion cost (--pod-deletion-cost); a scheduler doing so can: its pod name comes
from the downward API, a service account token is mounted where it reads it, that account may patch pods, and the
engine's egress reaches the Kubernetes API. Each returns a list of problems; an overlay without autoscaled engines
and without the updater has none to report."""

from __future__ import annotations

from typing import Any

from tests.unit.deploy.deploy_checks import (
    Pod,
    by_kind,
    container_command,
    literal_env,
    pods,
    service_config,
    service_module,
)
from tests.unit.deploy.hardening_checks import _selects_expr, scaled_targets

SCHEDULER = "pagedserve.services.scheduler"
API_PORTS = {443, 6443}  # the Kubernetes API: the Service kubernetes' port, its endpoints' usual one


def _engines(objects: list[dict]) -> list[Pod]:
    return [pod for pod in pods(objects) if pod.labels.get("app.kubernetes.io/component") == "engine"]


def _scheduler(pod: Pod, objects: list[dict]) -> tuple[dict, Any] | None:
    config_maps = by_kind(objects, "ConfigMap")
    for container in pod.containers(init=False):
        if service_module(container) == SCHEDULER:
            try:
                return container, service_config(container_command(container, config_maps),
                                                 literal_env(container, config_maps))
            except ValueError:
                return None  # check_commands names the bad command
    return None


def check_engine_scale_down(objects: list[dict]) -> list[str]:
    problems, scaled = [], scaled_targets(objects)
    for pod in _engines(objects):
        where = f"{pod.kind} {pod.name}"
        found = _scheduler(pod, objects)
        updating = found is not None and found[1].scale_down.pod_deletion_cost
        if (pod.kind, pod.name) in scaled:
            if pod.kind != "Deployment":
                problems.append(f"{where}: autoscaled, but a {pod.kind} ignores pod-deletion-cost (its scale-down "
                                "removes the highest ordinal, not the most duplicated replica)")
            if not updating:
                problems.append(f"{where}: autoscaled, but its scheduler does not keep its pod deletion cost "
                                "(--pod-deletion-cost)")
        if updating:
            problems += _updater_problems(where, pod, *found, objects)
    return problems


def _updater_problems(where: str, pod: Pod, scheduler: dict, config: Any, objects: list[dict]) -> list[str]:
    problems = []
    env = {v["name"]: v for v in scheduler.get("env", [])}
    name_field = env.get("PAGEDSERVE_POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if not config.scale_down.pod_name or name_field != "metadata.name":
        problems.append(f"{where}: the scheduler's --pod-name is not its pod's name (downward API metadata.name)")
    if not _token_mounted(pod, scheduler, config.scale_down.kubernetes_service_account_dir):
        problems.append(f"{where}: no service account token where the scheduler reads it "
                        f"({config.scale_down.kubernetes_service_account_dir})")
    account = pod.spec.get("serviceAccountName", "default")
    if account not in by_kind(objects, "ServiceAccount"):
        problems.append(f"{where}: runs as service account {account}, which these manifests do not make")
    elif not _may_patch_pods(account, objects):
        problems.append(f"{where}: service account {account} may not patch pods (no Role bound to it allows it)")
    if not _api_egress(pod, objects):
        problems.append(f"{where}: no egress to the Kubernetes API (ports {sorted(API_PORTS)})")
    return problems


def _token_mounted(pod: Pod, container: dict, folder: str) -> bool:
    if pod.spec.get("automountServiceAccountToken") is not False:
        return folder == "/var/run/secrets/kubernetes.io/serviceaccount"
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        sources = volumes.get(mount["name"], {}).get("projected", {}).get("sources", [])
        if mount["mountPath"] == folder and any(s.get("serviceAccountToken", {}).get("path") == "token"
                                                for s in sources):
            return True
    return False


def _may_patch_pods(account: str, objects: list[dict]) -> bool:
    roles = by_kind(objects, "Role")
    for binding in by_kind(objects, "RoleBinding").values():
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding.get("subjects", [])):
            continue
        role = roles.get(binding["roleRef"]["name"]) if binding["roleRef"]["kind"] == "Role" else None
        for rule in (role or {}).get("rules", []):
            if "" in rule.get("apiGroups", []) and "pods" in rule.get("resources", []) and \
                    "patch" in rule.get("verbs", []):
                return True
    return False


def _api_egress(pod: Pod, objects: list[dict]) -> bool:
    """Some egress policy of the pod allows the API ports to any address (the API's differs per cluster)."""
    for policy in by_kind(objects, "NetworkPolicy").values():
        spec = policy["spec"]
        if "Egress" not in spec.get("policyTypes", []) or not _selects_expr(spec["podSelector"], pod.labels):
            continue
        for rule in spec.get("egress", []):
            if not rule.get("to") and API_PORTS <= {p.get("port") for p in rule.get("ports", [])}:
                return True
    return False
