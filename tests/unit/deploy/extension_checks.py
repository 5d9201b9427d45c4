"""Checks of the optional cluster integrations in rendered overlays: mutual TLS between gateways and schedulers
(cert-manager Certificates), the Gateway API Inference Extension (an InferencePool and its endpoint picker) and
engine scale-down (scale_down_checks.py).
Each returns a list of problems; an overlay without the integration has none to report.

Internal TLS: a scheduler serving TLS is probed (and waited on by its worker's preStop) on a plaintext health
port, never its TLS port; every gateway dialling it dials TLS with a client certificate when the scheduler asks
for one, and checks a name the scheduler's certificate carries; each TLS file lies in a mounted Secret made by a
Certificate of the right usage, and both sides' Certificates come from one Issuer.
Inference pool: the pool selects pods whose target port is a pagedserve gateway routing to its own pod's
scheduler; its endpointPickerRef is a Service on that port in front of an EPP serving this pool; the EPP's
configuration scrapes the schedulers' metrics port and maps the pods' engine type to metric names the scheduler
exposes."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.unit.deploy.deploy_checks import (
    Pod,
    by_kind,
    container_command,
    container_ports,
    literal_env,
    metric_names,
    pods,
    selects,
    service_config,
    service_module,
)

POOL_GROUP = "inference.networking.k8s.io"


# --- internal TLS ----------------------------------------------------------------------------------------------

def _service_configs(objects: list[dict]) -> list[tuple[Pod, dict, Any]]:
    """(pod, container, parsed config) of every scheduler and gateway container."""
    config_maps, found = by_kind(objects, "ConfigMap"), []
    for pod in pods(objects):
        for container in pod.containers(init=False):
            if service_module(container) in ("pagedserve.services.scheduler", "pagedserve.services.gateway"):
                command = container_command(container, config_maps)
                found.append((pod, container, service_config(command, literal_env(container, config_maps))))
    return found


def _certificate_of(pod: Pod, container: dict, path: str, certificates: dict[str, dict]) -> dict | None:
    """The Certificate whose Secret is mounted where `path` lies, None when no such mount."""
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        if path.startswith(mount["mountPath"].rstrip("/") + "/"):
            secret = volumes.get(mount["name"], {}).get("secret", {}).get("secretName")
            return next((c for c in certificates.values() if c["spec"]["secretName"] == secret), None)
    return None


def _tls_files(where: str, pod: Pod, container: dict, tls, usage: str, certificates: dict[str, dict]
               ) -> tuple[dict | None, list[str]]:
    problems, issued = [], set()
    for path in (tls.internal_tls_cert, tls.internal_tls_key, tls.internal_tls_ca):
        if not path:
            continue
        certificate = _certificate_of(pod, container, path, certificates)
        if certificate is None:
            problems.append(f"{where}: TLS file {path} is in no mounted Secret of a cert-manager Certificate")
        else:
            issued.add(certificate["metadata"]["name"])
    if len(issued) > 1:
        problems.append(f"{where}: its TLS files come from several Certificates {sorted(issued)}")
    certificate = certificates.get(next(iter(issued))) if issued else None
    if certificate is not None and tls.internal_tls_cert and usage not in certificate["spec"].get("usages", []):
        problems.append(f"{where}: Certificate {certificate['metadata']['name']} lacks the usage {usage!r}")
    return certificate, problems


def check_internal_tls(objects: list[dict]) -> list[str]:
    problems = []
    certificates = by_kind(objects, "Certificate")
    configs = _service_configs(objects)
    schedulers = [(p, c, cfg) for p, c, cfg in configs if service_module(c) == "pagedserve.services.scheduler"]
    gateways = [(p, c, cfg) for p, c, cfg in configs if service_module(c) == "pagedserve.services.gateway"]
    server_certs = {}
    for pod, container, config in schedulers:
        where = f"{pod.name}/{container['name']}"
        if not config.tls.serves_tls:
            continue
        server_certs[pod.name], found = _tls_files(where, pod, container, config.tls, "server auth", certificates)
        problems += found + _plaintext_health(where, pod, container, config)
    for pod, container, config in gateways:
        where = f"{pod.name}/{container['name']}"
        local = config.scheduler_address.startswith("127.0.0.1:")
        dialled = [(p, cfg) for p, _, cfg in schedulers if not local or p.name == pod.name]
        serving_tls = [(p, cfg) for p, cfg in dialled if cfg.tls.serves_tls]
        if config.tls.dials_tls and not serving_tls:
            problems.append(f"{where}: dials TLS, but its schedulers serve plaintext")
        if not serving_tls:
            continue
        if not config.tls.dials_tls:
            problems.append(f"{where}: dials its schedulers in plaintext, but they serve TLS")
            continue
        client_cert, found = _tls_files(where, pod, container, config.tls, "client auth", certificates)
        problems += found
        for scheduler_pod, scheduler in serving_tls:
            if scheduler.tls.internal_tls_ca and not config.tls.internal_tls_cert:
                problems.append(f"{where}: presents no client certificate, which {scheduler_pod.name} requires")
            server_cert = server_certs.get(scheduler_pod.name)
            if server_cert is None:
                continue
            name = config.tls.internal_tls_server_name or config.scheduler_address.rsplit(":", 1)[0]
            if name not in server_cert["spec"].get("dnsNames", []):
                problems.append(f"{where}: checks the name {name!r}, which Certificate "
                                f"{server_cert['metadata']['name']} does not carry")
            if client_cert is not None and client_cert["spec"]["issuerRef"] != server_cert["spec"]["issuerRef"]:
                problems.append(f"{where}: its Certificate and {scheduler_pod.name}'s come from different issuers")
    return problems


def _plaintext_health(where: str, pod: Pod, container: dict, config) -> list[str]:
    """Probes and preStop waits speak plaintext gRPC: on a TLS scheduler they must use its --health-port."""
    problems = []
    if not config.health_port or config.health_port not in container_ports(container):
        problems.append(f"{where}: serves TLS without a declared --health-port for plaintext probes")
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        port = container.get(kind, {}).get("grpc", {}).get("port")
        if port == config.scheduler_port:
            problems.append(f"{where}: {kind} speaks plaintext gRPC to the TLS port {port}")
    for other in pod.containers(init=False):
        command = other.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        if "pagedserve.services.healthcheck" in command and f"127.0.0.1:{config.scheduler_port}" in command:
            problems.append(f"{pod.name}/{other['name']}: its preStop waits on the TLS port "
                            f"{config.scheduler_port} in plaintext (it would see it gone at once)")
    return problems


# --- Gateway API Inference Extension ---------------------------------------------------------------------------

def _arg(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _metric(spec: str) -> str:
    return re.split(r"[{\s]", spec, maxsplit=1)[0]


def check_inference_pools(objects: list[dict]) -> list[str]:
    problems = []
    services = by_kind(objects, "Service")
    all_pods = pods(objects)
    for name, pool in by_kind(objects, "InferencePool").items():
        where = f"InferencePool {name}"
        if pool["apiVersion"].split("/")[0] != POOL_GROUP:
            problems.append(f"{where}: group {pool['apiVersion']} is not {POOL_GROUP}")
        members = [p for p in all_pods if selects(pool["spec"]["selector"], p.labels)]
        if not members:
            problems.append(f"{where}: selects no pod")
        for pod in members:
            ports = [t.get("number") for t in pool["spec"].get("targetPorts", []) if isinstance(t, dict)]
            problems += _pool_member_problems(where, pod, ports, objects)  # a malformed port: the CRD schema says
        ref = pool["spec"].get("endpointPickerRef")
        if ref is None:
            problems.append(f"{where}: no endpointPickerRef")
            continue
        service = services.get(ref["name"])
        if service is None or ref["port"]["number"] not in {p["port"] for p in service["spec"]["ports"]}:
            problems.append(f"{where}: endpointPickerRef {ref['name']}:{ref['port']['number']} is no Service port")
            continue
        pickers = [p for p in all_pods if selects(service["spec"]["selector"], p.labels)]
        if not pickers:
            problems.append(f"{where}: the endpoint picker Service {ref['name']} selects no pod")
        for picker in pickers:
            problems += _picker_problems(where, name, picker, members, objects)
    return problems


def _pool_member_problems(where: str, pod: Pod, target_ports: list[int], objects: list[dict]) -> list[str]:
    """Each target port is a gateway of this pod that routes to the scheduler beside it."""
    problems = []
    config_maps = by_kind(objects, "ConfigMap")
    scheduler = next((c for c in pod.containers(init=False) if service_module(c) == "pagedserve.services.scheduler"),
                     None)
    for port in target_ports:
        gateway = next((c for c in pod.containers(init=False) if service_module(c) == "pagedserve.services.gateway"
                        and port in container_ports(c)), None)
        if gateway is None or scheduler is None:
            problems.append(f"{where}: port {port} of pod {pod.name} is not a pagedserve gateway beside a scheduler")
            continue
        config = service_config(container_command(gateway, config_maps), literal_env(gateway, config_maps))
        scheduler_config = service_config(container_command(scheduler, config_maps),
                                          literal_env(scheduler, config_maps))
        if config.scheduler_address != f"127.0.0.1:{scheduler_config.scheduler_port}":
            problems.append(f"{where}: the gateway on {pod.name}:{port} routes to {config.scheduler_address}, not "
                            "its own pod's scheduler (the picker already chose the pod)")
    return problems


def _picker_problems(where: str, pool_name: str, picker: Pod, members: list[Pod], objects: list[dict]) -> list[str]:
    """The EPP serves this pool, scrapes the schedulers' metrics port and reads metric names they expose."""
    problems = []
    config_maps = by_kind(objects, "ConfigMap")
    (container,) = picker.containers(init=False)
    args = container.get("args", [])
    if _arg(args, "--pool-name") != pool_name or _arg(args, "--pool-group") not in (None, POOL_GROUP):
        problems.append(f"{where}: the endpoint picker {picker.name} serves pool {_arg(args, '--pool-name')!r}")
    config_file = _arg(args, "--config-file") or ""
    volumes = {v["name"]: v for v in picker.spec.get("volumes", [])}
    mount = next((m for m in container.get("volumeMounts", [])
                  if config_file.startswith(m["mountPath"].rstrip("/") + "/")), None)
    map_name = volumes.get(mount["name"], {}).get("configMap", {}).get("name") if mount else None
    data = config_maps.get(map_name or "", {}).get("data", {})
    text = data.get(config_file.rsplit("/", 1)[-1])
    if text is None:
        return problems + [f"{where}: the endpoint picker's --config-file {config_file} is in no mounted ConfigMap"]
    config = yaml.safe_load(text)
    plugins = {p.get("name", p["type"]): p for p in config.get("plugins", [])}
    for profile in config.get("schedulingProfiles", []):
        for ref in profile.get("plugins", []):
            if ref["pluginRef"] not in plugins:
                problems.append(f"{where}: profile {profile['name']} refers to undeclared plugin {ref['pluginRef']}")
    source = next((p for p in plugins.values() if p["type"] == "metrics-data-source"), None)
    extractor = next((p for p in plugins.values() if p["type"] == "core-metrics-extractor"), None)
    if source is None or extractor is None:
        return problems + [f"{where}: the endpoint picker reads no metrics (metrics-data-source and "
                           "core-metrics-extractor)"]
    scrape_port = source.get("parameters", {}).get("port")
    params = extractor.get("parameters", {})
    label = params.get("engineLabelKey", "llm-d.ai/engine-type")
    engines = {e["name"]: e for e in params.get("engineConfigs", [])}
    exposed = metric_names()
    for pod in members:
        scheduler = next(c for c in pod.containers(init=False) if service_module(c) == "pagedserve.services.scheduler")
        scheduler_config = service_config(container_command(scheduler, config_maps),
                                          literal_env(scheduler, config_maps))
        if scrape_port != scheduler_config.metrics_port:
            problems.append(f"{where}: the picker scrapes port {scrape_port}, the schedulers' /metrics is on "
                            f"{scheduler_config.metrics_port}")
        engine = engines.get(pod.labels.get(label, params.get("defaultEngine", "vllm")))
        if engine is None:
            problems.append(f"{where}: pods {pod.name} have no engineConfigs entry for their {label} label")
            continue
        for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"):
            if _metric(engine.get(key, "")) not in exposed:
                problems.append(f"{where}: {key} {engine.get(key)!r} is no metric the scheduler exposes")
    return problems


def all_problems(objects: list[dict]) -> list[str]:
    from tests.unit.deploy.scale_down_checks import check_engine_scale_down

    return check_internal_tls(objects) + check_inference_pools(objects) + check_engine_scale_down(objects)
