"""Checks of the rendered manifests for what a cluster operator asks beyond correctness: one namespace, egress
policies, probe timeouts, no `replicas` where an autoscaler owns the count, Guaranteed QoS and /dev/shm for engines,
the nvidia RuntimeClass on GPU overlays, and autoscalers that read real series per replica. Each returns a list of
problems (empty: fine), like deploy_checks."""

from __future__ import annotations

import re

from tests.unit.deploy.deploy_checks import Pod, by_kind, metric_names, pods, selects, service_module

NAMESPACE = "pagedserve"
CLUSTER_SCOPED = {"Namespace"}
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")
# (from component, to component, port): the connections pagedserve needs besides DNS
FLOWS = {("gateway", "engine", 50051), ("gateway", "redis", 6379), ("gateway", "otel-collector", 4317),
         ("engine", "redis", 6379), ("engine", "otel-collector", 4317)}


def check_namespace(objects: list[dict]) -> list[str]:
    problems = [f"{o['kind']} {o['metadata']['name']}: namespace {o['metadata'].get('namespace')!r}, not {NAMESPACE}"
                for o in objects if o["kind"] not in CLUSTER_SCOPED and o["metadata"].get("namespace") != NAMESPACE]
    if NAMESPACE not in by_kind(objects, "Namespace"):
        problems.append(f"no Namespace {NAMESPACE} object")
    return problems


def scaled_targets(objects: list[dict]) -> set[tuple[str, str]]:
    """(kind, name) of every workload an HPA or a KEDA ScaledObject scales."""
    targets = set()
    for kind in ("HorizontalPodAutoscaler", "ScaledObject"):
        for obj in by_kind(objects, kind).values():
            ref = obj["spec"]["scaleTargetRef"]
            targets.add((ref.get("kind", "Deployment"), ref["name"]))
    return targets


def check_autoscaled_replicas(objects: list[dict]) -> list[str]:
    """A workload an autoscaler owns sets no `replicas` (each apply would reset the autoscaler's choice); each
    autoscaler's target exists; one autoscaler per workload."""
    problems, owners = [], {}
    for kind in ("HorizontalPodAutoscaler", "ScaledObject"):
        for name, obj in by_kind(objects, kind).items():
            ref = obj["spec"]["scaleTargetRef"]
            target = (ref.get("kind", "Deployment"), ref["name"])
            if target in owners:
                problems.append(f"{target[0]} {target[1]} is scaled by both {owners[target]} and {kind} {name}")
            owners[target] = f"{kind} {name}"
            workload = by_kind(objects, target[0]).get(target[1])
            if workload is None:
                problems.append(f"{kind} {name} scales a missing {target[0]} {target[1]}")
            elif "replicas" in workload["spec"]:
                problems.append(f"{target[0]} {target[1]} sets replicas although {kind} {name} owns the count")
    return problems


def check_probe_timeouts(objects: list[dict]) -> list[str]:
    return [f"{pod.name}/{c['name']}: {kind} has no timeoutSeconds (the 1 s default fails under load)"
            for pod in pods(objects) for c in pod.containers(init=False)
            for kind in PROBES if kind in c and "timeoutSeconds" not in c[kind]]


def _engine(objects: list[dict]) -> Pod | None:
    return next((p for p in pods(objects) if p.labels.get("app.kubernetes.io/component") == "engine"), None)


def check_engine_pod(objects: list[dict], overlay: str) -> list[str]:
    """Guaranteed QoS (every container, init ones included, requests == limits for CPU and memory), /dev/shm on
    a memory emptyDir for the worker, and on GPU overlays the nvidia RuntimeClass."""
    engine = _engine(objects)
    if engine is None:
        return ["no engine pod"]
    problems = []
    for container in engine.containers():
        resources = container.get("resources", {})
        for resource in ("cpu", "memory"):
            request = resources.get("requests", {}).get(resource)
            if request is None or str(request) != str(resources.get("limits", {}).get(resource)):
                problems.append(f"engine/{container['name']}: {resource} request {request} != limit "
                                f"{resources.get('limits', {}).get(resource)} (not Guaranteed QoS)")
    volumes = {v["name"]: v for v in engine.spec.get("volumes", [])}
    worker = next((c for c in engine.containers(init=False) if service_module(c) == "pagedserve.services.gpu_worker"),
                  {})
    shm = [m for m in worker.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
    if not shm or volumes.get(shm[0]["name"], {}).get("emptyDir", {}).get("medium") != "Memory":
        problems.append("engine/gpu-worker: /dev/shm is not a memory emptyDir")
    if overlay.startswith("gpu") and engine.spec.get("runtimeClassName") != "nvidia":
        problems.append(f"engine: runtimeClassName {engine.spec.get('runtimeClassName')!r} on a GPU overlay")
    return problems


def _component(pod: Pod) -> str:
    return pod.labels.get("app.kubernetes.io/component", pod.name)


def _egress_allows(policy: dict, target: Pod | None, port: int, dns: bool = False) -> bool:
    for rule in policy["spec"].get("egress", []):
        ports = {p.get("port") for p in rule.get("ports", [])}
        if ports and port not in ports:
            continue
        for peer in rule.get("to", []) or [{}]:
            if dns and peer.get("namespaceSelector", {}).get("matchLabels", {}).get(
                    "kubernetes.io/metadata.name") == "kube-system":
                return True
            if target is not None and "podSelector" in peer and "namespaceSelector" not in peer and selects(
                    peer["podSelector"], target.labels):
                return True
    return False


def check_egress(objects: list[dict]) -> list[str]:
    """Egress is denied by default; every pod may reach DNS; the flows pagedserve needs are allowed."""
    policies = list(by_kind(objects, "NetworkPolicy").values())
    problems = []
    if not any(p["spec"]["podSelector"] == {} and "Egress" in p["spec"].get("policyTypes", [])
               and not p["spec"].get("egress") for p in policies):
        problems.append("no default-deny egress NetworkPolicy")
    by_component = {_component(p): p for p in pods(objects)}

    def applying(pod: Pod) -> list[dict]:
        return [p for p in policies if "Egress" in p["spec"].get("policyTypes", [])
                and (p["spec"]["podSelector"] == {} or _selects_expr(p["spec"]["podSelector"], pod.labels))]

    for pod in pods(objects):
        if not any(_egress_allows(p, None, 53, dns=True) for p in applying(pod)):
            problems.append(f"{pod.name}: may not resolve names (no egress to kube-dns on 53)")
    for source, target, port in sorted(FLOWS):
        if source in by_component and target in by_component and not any(
                _egress_allows(p, by_component[target], port) for p in applying(by_component[source])):
            problems.append(f"egress from {source} to {target}:{port} is not allowed")
    return problems


def _selects_expr(selector: dict, labels: dict) -> bool:
    """matchLabels and matchExpressions (In only)."""
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(labels.get(e["key"]) in e.get("values", []) for e in selector.get("matchExpressions", [])
               if e["operator"] == "In")


def check_autoscalers(objects: list[dict]) -> list[str]:
    """KEDA's Prometheus triggers and the HPA's external metrics read series the schedulers export, as averages
    per replica, in this namespace."""
    problems, known = [], metric_names()
    for name, obj in by_kind(objects, "ScaledObject").items():
        for trigger in obj["spec"]["triggers"]:
            query = trigger["metadata"].get("query", "")
            for metric in re.findall(r"\b(pagedserve_[a-z0-9_]+)", query):
                if metric not in known:
                    problems.append(f"ScaledObject {name}: {trigger['name']} reads {metric}, which no service exposes")
            if f'namespace="{NAMESPACE}"' not in query:
                problems.append(f"ScaledObject {name}: {trigger['name']} does not select namespace {NAMESPACE}")
            if trigger.get("metricType", "AverageValue") != "AverageValue":
                problems.append(f"ScaledObject {name}: {trigger['name']} is not a per-replica average")
    for name, obj in by_kind(objects, "HorizontalPodAutoscaler").items():
        for metric in obj["spec"].get("metrics", []):
            if metric["type"] == "External":
                if metric["external"]["metric"]["name"] not in known:
                    problems.append(f"HPA {name}: external metric {metric['external']['metric']['name']} unknown")
                if metric["external"]["target"]["type"] != "AverageValue":
                    problems.append(f"HPA {name}: external metric {metric['external']['metric']['name']} is not "
                                    "a per-replica average")
    return problems


def all_problems(objects: list[dict], overlay: str) -> list[str]:
    problems = check_engine_pod(objects, overlay)
    for check in (check_namespace, check_autoscaled_replicas, check_probe_timeouts, check_egress, check_autoscalers):
        problems += check(objects)
    return problems
