"""Checks of the deploy files with the real tools plus our own cross-references. Each check returns a list of
problems (empty: fine), so that test_deploy.py asserts none on the real files and test_mutations.py asserts that
each deliberate breakage of a copy is found.

Real tools: `kubectl kustomize` renders each overlay, `kubernetes-validate --strict` validates every rendered
object, `docker compose config` resolves the compose files, `hadolint` lints the Dockerfile and `promtool check
config` the Prometheus configuration. Our own checks read the rendered objects: references (ConfigMap, Secret and
key, PVC, volume, Service selector and port, HPA/PDB target), probes (ports and paths served, liveness that
depends on nothing else, startup probes), security context, resources, pinned images, drain timing, network
policies and the commands' flags (parsed by each service's own config)."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import yaml

from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.gpu_worker.server import SERVICE_NAME as WORKER_READINESS
from pagedserve.services.gpu_worker.service_config import WorkerServiceConfig
from pagedserve.services.scheduler.server import SERVICE_NAME as SCHEDULER_READINESS
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.shared.cli_config import ConfigError, add_config_arguments, config_from_args, env_name
from tests.unit.deploy import deploy_tools
from tests.unit.deploy.compose_tls_checks import CERTS, check_compose_tls

# gpu-keda, gpu-hpa, gpu-mtls and gpu-inference-pool add the optional components to gpu; gpu-tp: N GPUs per engine
OVERLAYS = ("gpu", "cpu", "gpu-keda", "gpu-hpa", "gpu-tp", "gpu-mtls", "gpu-inference-pool")
IMAGE = "pagedserve"
SERVICES = {  # module -> (its config, its positional arguments, its gRPC readiness service)
    "pagedserve.services.gpu_worker": (WorkerServiceConfig, ("model_dir",), WORKER_READINESS),
    "pagedserve.services.scheduler": (SchedulerServiceConfig, (), SCHEDULER_READINESS),
    "pagedserve.services.gateway": (GatewayConfig, ("model_dir",), None),
}
# Agreed in the team's conventions and taken by the services (some helpers land them in parallel).
AGREED_ENV = {"PAGEDSERVE_DRAIN_TIMEOUT_S", "PAGEDSERVE_INTERNAL_TOKEN"}
HTTP_LIVENESS, HTTP_READINESS = "/livez", "/health"
PRESTOP_MARGIN_S = 10  # grace beyond preStop + drain, for the process to exit
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
POD_KINDS = ("Deployment", "StatefulSet", "Job", "DaemonSet")
FETCH_MODEL = ["python", "deploy/scripts/fetch_model.py"]
CRD_SCHEMAS = Path(__file__).parent / "crd_schemas"  # vendored openAPIV3Schema of each custom kind (README there)
_REF = re.compile(r"\$\((\w+)\)")


# --- rendering and the real tools ------------------------------------------------------------------------------

def render(root: Path, overlay: str) -> tuple[list[dict], list[str]]:
    """`kubectl kustomize` of one overlay: (objects, problems)."""
    done = deploy_tools.run([deploy_tools.kubectl(), "kustomize", str(root / "deploy/k8s/overlays" / overlay)])
    if done.returncode != 0:
        return [], [f"{overlay}: kubectl kustomize failed: {done.stderr.strip()[-500:]}"]
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc], []


def validate_schemas(root: Path, rendered: dict[str, list[dict]]) -> list[str]:
    """`kubernetes-validate --strict` on every core object (one run over all overlays); objects of a custom kind
    against its vendored CRD schema, strictly (no field the schema does not name)."""
    problems = []
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / f"{overlay}.yaml" for overlay in rendered]
        for path, objects in zip(paths, rendered.values(), strict=True):
            path.write_text(yaml.safe_dump_all([o for o in objects if crd_schema_path(o) is None]))
        done = deploy_tools.run([deploy_tools.kubernetes_validate(), "--strict", "--quiet", *map(str, paths)])
    if done.returncode != 0:
        problems.append(f"kubernetes-validate: {(done.stdout + done.stderr).strip()[-800:]}")
    for overlay, objects in rendered.items():
        problems += [f"[{overlay}] {p}" for o in objects if crd_schema_path(o) for p in validate_custom(o)]
    return problems


def crd_schema_path(obj: dict) -> Path | None:
    """The vendored schema of a custom kind (group_kind_version.json), None for a core kind (a group without a dot,
    or a *.k8s.io group with no vendored schema: Kubernetes' own, which kubernetes-validate knows)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    path = CRD_SCHEMAS / f"{group}_{obj['kind'].lower()}_{version}.json"
    if "." not in group or (group.endswith(".k8s.io") and not path.is_file()):
        return None
    return path


@functools.cache
def _strict_schema(path: Path) -> dict:
    def strict(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)
        return node

    return strict(json.loads(path.read_text()))


def validate_custom(obj: dict) -> list[str]:
    import jsonschema

    path, name = crd_schema_path(obj), f"{obj['kind']} {obj['metadata']['name']}"
    if not path.is_file():
        return [f"{name}: no vendored CRD schema {path.name} for {obj['apiVersion']}"]
    validator = jsonschema.Draft7Validator(_strict_schema(path))
    return [f"{name}: CRD schema: {'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
            for e in validator.iter_errors(obj)]


def resolved_dockerfile(root: Path, out_dir: Path) -> Path | None:
    """The Dockerfile as built by default, written under out_dir: `FROM ${BASE_IMAGE}` replaced by the ARG's default
    (hadolint and checkov do not resolve build args, so an unpinned default would pass them); None without one."""
    text = (root / "deploy/docker/Dockerfile").read_text()
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    if default is None:
        return None
    resolved = out_dir / "Dockerfile"
    resolved.write_text(text.replace("FROM ${BASE_IMAGE}", f"FROM {default.group(1)}"))
    return resolved


def hadolint(root: Path) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        resolved = resolved_dockerfile(root, Path(tmp))
        if resolved is None:
            return ["Dockerfile: no `ARG BASE_IMAGE=<pinned image>` before its FROM"]
        done = deploy_tools.run([deploy_tools.hadolint(), str(resolved)])
    return [] if done.returncode == 0 else [f"hadolint: {done.stdout.strip()}{done.stderr.strip()}"]


def promtool_config(root: Path) -> list[str]:
    config = root / "deploy/prometheus/prometheus.yml"
    done = deploy_tools.run([deploy_tools.promtool(), "check", "config", str(config)])
    return [] if done.returncode == 0 else [f"promtool check config: {(done.stdout + done.stderr).strip()}"]


COMPOSE_FILES = {"gpu": ("docker-compose.yml",), "cpu": ("docker-compose.yml", "deploy/compose.cpu.yml"),
                 "gpu-mtls": ("docker-compose.yml", "deploy/compose.mtls.yml"),
                 "cpu-mtls": ("docker-compose.yml", "deploy/compose.cpu.yml", "deploy/compose.mtls.yml")}


def compose_config(root: Path, variant: str, env: dict[str, str] | None = None) -> tuple[dict, list[str]]:
    """`docker compose config` (resolved, as JSON) of a file set: GPU or CPU, with or without mTLS."""
    argv = [deploy_tools.docker_compose()]
    for name in COMPOSE_FILES[variant]:
        argv += ["-f", str(root / name)]
    done = subprocess.run([*argv, "config", "--format", "json"], cwd=root, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("PAGEDSERVE_")} | (env or {}))
    if done.returncode != 0:
        return {}, [f"docker compose config ({variant}): {done.stderr.strip()[-500:]}"]
    return json.loads(done.stdout), []


# --- reading rendered objects ----------------------------------------------------------------------------------

@dataclass
class Pod:
    kind: str
    name: str
    labels: dict
    spec: dict  # the pod spec

    def containers(self, init: bool = True) -> list[dict]:
        return self.spec.get("containers", []) + (self.spec.get("initContainers", []) if init else [])


def pods(objects: list[dict]) -> list[Pod]:
    found = []
    for obj in objects:
        if obj["kind"] in POD_KINDS:
            template = obj["spec"]["template"]
            spec = dict(template["spec"])
            claims = [{"name": c["metadata"]["name"], "volumeClaimTemplate": c}
                      for c in obj["spec"].get("volumeClaimTemplates", [])]
            spec["volumes"] = spec.get("volumes", []) + claims  # a claim template is a volume of each pod
            found.append(Pod(obj["kind"], obj["metadata"]["name"], template["metadata"].get("labels", {}), spec))
    return found


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def selects(selector: dict, labels: dict) -> bool:
    match = selector.get("matchLabels", selector) if selector else {}
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def container_ports(container: dict) -> dict:
    """name -> number and number -> number of a container's ports."""
    ports = {}
    for port in container.get("ports", []):
        ports[port["containerPort"]] = port["containerPort"]
        if "name" in port:
            ports[port["name"]] = port["containerPort"]
    return ports


def service_module(container: dict) -> str | None:
    command = container.get("command", [])
    return command[2] if command[:2] == ["python", "-m"] and len(command) > 2 else None


def service_config(command: list[str], env: dict[str, str]):
    """The config a `python -m services.X ...` command builds with this environment; raises ConfigError."""
    import argparse

    cls, positional, _ = SERVICES[command[2]]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_arguments(parser, cls, positional)
    argv = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", arg) for arg in command[3:]]
    try:
        args = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ConfigError(f"{shlex.join(command)}: {exc}") from None
    return config_from_args(cls, args, env)


def literal_env(container: dict, config_maps: dict[str, dict]) -> dict[str, str]:
    """The environment a container gets from literal values and its ConfigMaps (secrets read as '<secret>')."""
    env = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref and ref["name"] in config_maps:
            env.update(config_maps[ref["name"]].get("data", {}))
    for var in container.get("env", []):
        source = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[var["name"]] = config_maps.get(ref["name"], {}).get("data", {}).get(ref["key"], "<missing>")
        else:
            env[var["name"]] = "<secret>" if "secretKeyRef" in source else "<field>"
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in a command or env value (an unknown VAR is left as written)."""
    return _REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def container_command(container: dict, config_maps: dict[str, dict]) -> list[str]:
    env = literal_env(container, config_maps)
    return [expand(arg, env) for arg in container.get("command", [])]


# --- checks on rendered Kubernetes objects ---------------------------------------------------------------------

def check_references(objects: list[dict]) -> list[str]:
    """Every ConfigMap, Secret (and key), PVC and volume a pod refers to exists (a Secret volume may come from a
    cert-manager Certificate)."""
    problems = []
    config_maps, secrets = by_kind(objects, "ConfigMap"), by_kind(objects, "Secret")
    claims = by_kind(objects, "PersistentVolumeClaim")
    issued = {c["spec"]["secretName"] for c in by_kind(objects, "Certificate").values()}
    for pod in pods(objects):
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume and volume["persistentVolumeClaim"]["claimName"] not in claims:
                problems.append(f"{pod.name}: volume {volume['name']} claims a missing PVC")
            if "configMap" in volume and volume["configMap"]["name"] not in config_maps:
                problems.append(f"{pod.name}: volume {volume['name']} refers to a missing ConfigMap")
            if "secret" in volume and volume["secret"]["secretName"] not in set(secrets) | issued:
                problems.append(f"{pod.name}: volume {volume['name']} mounts Secret {volume['secret']['secretName']}, "
                                "which neither these manifests nor a cert-manager Certificate make")
        for container in pod.containers():
            where = f"{pod.name}/{container['name']}"
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in volumes:
                    problems.append(f"{where}: mounts volume {mount['name']}, which the pod does not have")
            for source in container.get("envFrom", []):
                if "configMapRef" in source and source["configMapRef"]["name"] not in config_maps:
                    problems.append(f"{where}: envFrom a missing ConfigMap {source['configMapRef']['name']}")
                optional = source.get("secretRef", {}).get("optional", False)
                if "secretRef" in source and not optional and source["secretRef"]["name"] not in secrets:
                    problems.append(f"{where}: envFrom a missing Secret {source['secretRef']['name']}")
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    secret = secrets.get(ref["name"])
                    keys = set(secret.get("data", {})) | set(secret.get("stringData", {})) if secret else set()
                    if ref["key"] not in keys:
                        problems.append(f"{where}: {var['name']} reads key {ref['key']} of Secret {ref['name']}, "
                                        "which does not exist")
                ref = var.get("valueFrom", {}).get("configMapKeyRef")
                if ref is not None and ref["key"] not in config_maps.get(ref["name"], {}).get("data", {}):
                    problems.append(f"{where}: {var['name']} reads a missing ConfigMap key {ref['key']}")
    return problems


def check_services(objects: list[dict]) -> list[str]:
    """Every Service selects pods, and each of its target ports is a port of one of their containers."""
    problems = []
    for name, service in by_kind(objects, "Service").items():
        selected = [p for p in pods(objects) if selects(service["spec"]["selector"], p.labels)]
        if not selected:
            problems.append(f"Service {name} selects no pod")
            continue
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if not any(target in container_ports(c) for p in selected for c in p.containers(init=False)):
                problems.append(f"Service {name} sends port {port['port']} to {target}, which no container serves")
    for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget"):
        for name, obj in by_kind(objects, kind).items():
            if kind == "HorizontalPodAutoscaler":
                ref = obj["spec"]["scaleTargetRef"]
                if ref["name"] not in by_kind(objects, ref["kind"]):
                    problems.append(f"HPA {name} scales a missing {ref['kind']} {ref['name']}")
            elif not any(selects(obj["spec"]["selector"], p.labels) for p in pods(objects)):
                problems.append(f"PDB {name} selects no pod")
    return problems


@functools.cache
def _http_paths(module: str) -> frozenset[str]:
    """The paths the gateway's real app serves."""
    from pagedserve.services.gateway.api.serving import Serving
    from pagedserve.services.gateway.app import create_app
    from pagedserve.services.gateway.routing.replicas import ReplicaSet

    assert module == "pagedserve.services.gateway"
    serving = Serving(GatewayConfig(model_dir="unused"), tokenizer=None, replicas=ReplicaSet([], make_client=None),
                      generation_defaults={})
    return frozenset(route.path for route in create_app(serving).routes)


def check_probes(objects: list[dict]) -> list[str]:
    """Probes hit ports and paths the container serves; liveness depends on nothing else (gRPC "" or /livez);
    readiness is the service's own readiness; every pagedserve service has startup, liveness and readiness."""
    problems = []
    for pod in pods(objects):
        for container in pod.containers(init=False):
            where, module = f"{pod.name}/{container['name']}", service_module(container)
            ports = container_ports(container)
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = container.get(kind)
                if probe is None:
                    if module in SERVICES:
                        problems.append(f"{where}: no {kind}")
                    continue
                handler = next(k for k in ("grpc", "httpGet", "tcpSocket", "exec") if k in probe)
                port = probe[handler].get("port") if handler != "exec" else None
                if handler != "exec" and port not in ports:
                    problems.append(f"{where}: {kind} probes port {port}, which the container does not serve")
                if module not in SERVICES:
                    continue
                problems += _probe_meaning(where, module, kind, handler, probe[handler])
    return problems


def _probe_meaning(where: str, module: str, kind: str, handler: str, spec: dict) -> list[str]:
    readiness = SERVICES[module][2]
    if handler == "grpc":
        service = spec.get("service", "")
        wanted = readiness if kind == "readinessProbe" else ""
        if kind == "startupProbe" and service == readiness:  # startup may wait for the model: it is no liveness
            return []
        if service != wanted:
            return [f"{where}: {kind} asks gRPC health for {service!r}; it must ask {wanted!r}"
                    + (" (liveness must not follow another service)" if kind != "readinessProbe" else "")]
        return []
    if handler == "httpGet":
        path = spec.get("path", "/")
        if path not in _http_paths(module):
            return [f"{where}: {kind} GETs {path}, which the gateway does not serve"]
        wanted = HTTP_READINESS if kind == "readinessProbe" else HTTP_LIVENESS
        if path != wanted:
            return [f"{where}: {kind} GETs {path}; it must GET {wanted}"]
        return []
    return [f"{where}: {kind} uses {handler}; pagedserve services are probed by gRPC health or HTTP"]


def check_security(objects: list[dict], image_user: int | None) -> list[str]:
    problems = []
    for pod in pods(objects):
        context = pod.spec.get("securityContext", {})
        if context.get("runAsNonRoot") is not True or not context.get("runAsUser"):
            problems.append(f"{pod.name}: pod must set runAsNonRoot and a numeric non-root runAsUser")
        if context.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{pod.name}: pod must use the RuntimeDefault seccomp profile")
        uses_image = any(c["image"].split(":")[0].endswith(IMAGE) for c in pod.containers())
        if uses_image and image_user is not None and context.get("runAsUser") != image_user:
            problems.append(f"{pod.name}: runAsUser {context.get('runAsUser')} is not the image's user {image_user}")
        for container in pod.containers():
            sc, where = container.get("securityContext", {}), f"{pod.name}/{container['name']}"
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allowPrivilegeEscalation must be false")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: readOnlyRootFilesystem must be true")
            if sc.get("capabilities", {}).get("drop") != ["ALL"]:
                problems.append(f"{where}: capabilities must drop ALL")
            if sc.get("privileged"):
                problems.append(f"{where}: privileged")
    return problems


def _gpu_problems(where: str, worker: dict, config_maps: dict[str, dict]) -> list[str]:
    """A GPU worker reserves one GPU for each tensor-parallel rank, in its requests and its limits."""
    resources = worker.get("resources", {})
    gpus = resources.get("limits", {}).get("nvidia.com/gpu")
    if not gpus:
        return [f"{where}: the gpu overlay's worker reserves no nvidia.com/gpu"]
    try:
        ranks = service_config(container_command(worker, config_maps),
                               literal_env(worker, config_maps)).worker.tensor_parallel_size
    except (ConfigError, ValueError):
        return []  # check_commands names the bad command
    problems = []
    for part in ("requests", "limits"):
        reserved = resources.get(part, {}).get("nvidia.com/gpu")
        if str(reserved) != str(ranks):
            problems.append(f"{where}: resources.{part} nvidia.com/gpu {reserved} for --tensor-parallel-size "
                            f"{ranks} (one GPU a rank)")
    return problems


def check_resources(objects: list[dict], overlay: str) -> list[str]:
    """Requests and limits of CPU and memory everywhere (no BestEffort pod), valid quantities, and the GPU."""
    problems = []
    for pod in pods(objects):
        for container in pod.containers():
            where, resources = f"{pod.name}/{container['name']}", container.get("resources", {})
            for part in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    if resource not in resources.get(part, {}):
                        problems.append(f"{where}: no {resource} in resources.{part}")
            for part in ("requests", "limits"):
                for resource, value in resources.get(part, {}).items():
                    if not _QUANTITY.match(str(value)):
                        problems.append(f"{where}: resources.{part}.{resource} {value!r} is not a quantity")
            if service_module(container) == "pagedserve.services.gpu_worker" and overlay.startswith("gpu"):
                problems += _gpu_problems(where, container, by_kind(objects, "ConfigMap"))
    claims = {**by_kind(objects, "PersistentVolumeClaim"),
              **{f"{o['metadata']['name']}/{c['metadata']['name']}": c for o in by_kind(objects, "StatefulSet").values()
                 for c in o["spec"].get("volumeClaimTemplates", [])},
              **{f"{pod.name}/{v['name']}": v["ephemeral"]["volumeClaimTemplate"] for pod in pods(objects)
                 for v in pod.spec.get("volumes", []) if "ephemeral" in v}}
    for name, claim in claims.items():
        size = claim["spec"].get("resources", {}).get("requests", {}).get("storage", "")
        if not _QUANTITY.match(str(size)):
            problems.append(f"PVC {name}: storage {size!r} is not a quantity")
    return problems


def check_images(objects: list[dict]) -> list[str]:
    """Every image pinned to a version, and every pagedserve container of an overlay on the same one."""
    problems, ours = [], set()
    for pod in pods(objects):
        for container in pod.containers():
            image = container["image"]
            tag = image.rsplit(":", 1)[1] if ":" in image.split("/")[-1] else ""
            if "@sha256:" not in image and (not tag or tag == "latest"):
                problems.append(f"{pod.name}/{container['name']}: image {image} is not pinned to a version")
            if image.split(":")[0].endswith(IMAGE):
                ours.add(image)
    if len(ours) > 1:
        problems.append(f"pagedserve containers run different images: {sorted(ours)}")
    return problems


def _seconds(command: list[str]) -> float:
    """How long a preStop command may take: `sleep N`, or the healthcheck's --wait-gone-s N."""
    if command[:1] == ["sleep"]:
        return float(command[1])
    if "--wait-gone-s" in command:
        return float(command[command.index("--wait-gone-s") + 1])
    return 0.0


def check_draining(objects: list[dict]) -> list[str]:
    """terminationGracePeriodSeconds covers each container's preStop plus its drain; the worker outlives the
    scheduler's preStop and drain."""
    problems = []
    config_maps = by_kind(objects, "ConfigMap")
    for pod in pods(objects):
        grace = pod.spec.get("terminationGracePeriodSeconds", 30)
        needed, drains = {}, {}
        for container in pod.containers(init=False):
            pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            drain = float(literal_env(container, config_maps).get("PAGEDSERVE_DRAIN_TIMEOUT_S", 0))
            module = service_module(container)
            if module in ("pagedserve.services.gateway",
                          "pagedserve.services.scheduler") and (not drain or not pre_stop):
                problems.append(f"{pod.name}/{container['name']}: needs PAGEDSERVE_DRAIN_TIMEOUT_S and a preStop")
            drains[module] = _seconds(pre_stop) + drain
            needed[container["name"]] = drains[module] + PRESTOP_MARGIN_S
        for name, seconds in needed.items():
            if grace < seconds:
                problems.append(f"{pod.name}: terminationGracePeriodSeconds {grace} < {seconds:.0f} that {name} "
                                "needs to drain")
        if "pagedserve.services.gpu_worker" in drains and "pagedserve.services.scheduler" in drains:
            if drains["pagedserve.services.gpu_worker"] < drains["pagedserve.services.scheduler"]:
                problems.append(f"{pod.name}: the worker's preStop ends before its scheduler has drained")
    return problems


def check_commands(objects: list[dict]) -> list[str]:
    """Every service command parses with its own flags and environment, and its addresses point at what serves
    them: gateway -> a Service on the scheduler's port; scheduler -> its worker on localhost in the same pod;
    Redis and the OTLP endpoint -> Services; one model folder for the model Job, engines and gateways."""
    problems, configs = [], {}
    config_maps, services = by_kind(objects, "ConfigMap"), by_kind(objects, "Service")
    service_ports = {name: {p["port"] for p in s["spec"]["ports"]} for name, s in services.items()}
    model_dirs = set()
    for pod in pods(objects):
        for container in pod.containers():
            module, where = service_module(container), f"{pod.name}/{container['name']}"
            env, command = literal_env(container, config_maps), container_command(container, config_maps)
            if command[:2] == FETCH_MODEL:
                model_dirs.add(command[3])
            if module not in SERVICES:
                continue
            known = {env_name(f) for f in _field_names(SERVICES[module][0])} | AGREED_ENV
            for var in env:
                if var.startswith("PAGEDSERVE_") and var not in known:
                    problems.append(f"{where}: {var} is not a setting of {module}")
            try:
                configs[pod.name, module] = config = service_config(command, env)
            except (ConfigError, ValueError) as exc:
                problems.append(f"{where}: {exc}")
                continue
            if hasattr(config, "model_dir"):
                model_dirs.add(config.model_dir)
            if hasattr(config, "worker"):
                model_dirs.add(config.worker.model_dir)
            problems += _endpoint_problems(where, env.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""), service_ports)
    for (pod_name, module), config in configs.items():
        where = f"{pod_name}/{module}"
        if module == "pagedserve.services.scheduler":
            worker = configs.get((pod_name, "pagedserve.services.gpu_worker"))
            if worker is None or config.worker_address != f"127.0.0.1:{worker.worker_port}":
                problems.append(f"{where}: --worker-address {config.worker_address} is not its pod's worker")
            problems += _endpoint_problems(where, config.state.redis_url, service_ports)
        if module == "pagedserve.services.gateway":
            problems += _gateway_problems(where, config, configs.get((pod_name, "pagedserve.services.scheduler")),
                                          configs,
                                          services, service_ports)
    if len(model_dirs) > 1:
        problems.append(f"the fetch-model init containers and the services disagree on the model folder: "
                        f"{sorted(model_dirs)}")
    return problems


def _gateway_problems(where: str, config, local_scheduler, configs: dict, services: dict[str, dict],
                      service_ports: dict[str, set[int]]) -> list[str]:
    """Each --scheduler-address entry is a headless Service on the schedulers' port (one address per engine pod,
    each a replica to route to), or, for a gateway inside an engine pod, that pod's own scheduler on localhost;
    prefix routing reads the engines' indexes from a Redis Service."""
    problems = []
    schedulers = [c for (_, m), c in configs.items() if m == "pagedserve.services.scheduler"]
    for target in config.scheduler_address.split(","):
        host, port = target.strip().rsplit(":", 1)
        if host == "127.0.0.1":
            if local_scheduler is None or local_scheduler.scheduler_port != int(port):
                problems.append(f"{where}: --scheduler-address {target} is no scheduler of its own pod")
        elif int(port) not in service_ports.get(host, set()) or not any(
                s.scheduler_port == int(port) for s in schedulers):
            problems.append(f"{where}: --scheduler-address {target} reaches no scheduler")
        elif services[host]["spec"].get("clusterIP") != "None":
            problems.append(f"{where}: --scheduler-address {target} is Service {host}, which is not headless: the "
                            "gateway would see one replica")
    if config.routing == "prefix":
        if not config.redis_url:
            problems.append(f"{where}: --routing prefix without --redis-url routes by hashing only")
        problems += _endpoint_problems(where, config.redis_url, service_ports)
    return problems


def _field_names(cls) -> Iterator[str]:
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _field_names(hints[f.name])
        else:
            yield f.name


def _endpoint_problems(where: str, url: str, service_ports: dict[str, set[int]]) -> list[str]:
    match = re.match(r"^\w+://([^/:]+):(\d+)", url)
    if not url:
        return []
    if match is None or int(match.group(2)) not in service_ports.get(match.group(1), set()):
        return [f"{where}: {url} is not a Service port of these manifests"]
    return []


def check_network_policies(objects: list[dict]) -> list[str]:
    """Ingress is denied by default; only gateways reach the schedulers' gRPC; nothing reaches a worker's port
    from outside its pod; only engines (its writers) and gateways (which route by it) reach Redis."""
    problems = []
    policies = list(by_kind(objects, "NetworkPolicy").values())
    if not any(p["spec"]["podSelector"] == {} and "Ingress" in p["spec"].get("policyTypes", []) and
               not p["spec"].get("ingress") for p in policies):
        problems.append("no default-deny ingress NetworkPolicy")
    pod_list = pods(objects)

    def component(pod: Pod) -> str:
        return pod.labels.get("app.kubernetes.io/component", pod.name)

    def allowed(target: Pod, port: int) -> set[str]:
        """Components allowed to reach `port` of `target` ('*' for anyone)."""
        sources: set[str] = set()
        for policy in policies:
            if not selects(policy["spec"]["podSelector"], target.labels):
                continue
            for rule in policy["spec"].get("ingress", []):
                rule_ports = {p.get("port") for p in rule.get("ports", [])}
                if rule_ports and port not in rule_ports:
                    continue
                if not rule.get("from"):
                    sources.add("*")
                for peer in rule.get("from", []):
                    if "namespaceSelector" in peer or "ipBlock" in peer:
                        sources.add("other-namespace")
                    else:
                        sources |= {component(p) for p in pod_list if selects(peer["podSelector"], p.labels)}
        return sources

    for pod in pod_list:
        for container in pod.containers(init=False):
            module = service_module(container)
            for port in {p["containerPort"] for p in container.get("ports", [])}:
                sources = allowed(pod, port)
                if module == "pagedserve.services.scheduler" and port == 50051 and sources != {"gateway"}:
                    problems.append(f"{pod.name}: scheduler gRPC reachable from {sorted(sources)}, not gateways only")
                if module == "pagedserve.services.gpu_worker" and sources:
                    problems.append(f"{pod.name}: worker port {port} reachable from {sorted(sources)}")
                if component(pod) == "redis" and sources != {"engine", "gateway"}:
                    problems.append(f"{pod.name}: Redis reachable from {sorted(sources)}, not engines and gateways")
                if module == "pagedserve.services.gateway" and port == 8000 and "*" not in sources:
                    problems.append(f"{pod.name}: clients cannot reach the gateway")
    return problems


def dockerfile_user(root: Path) -> tuple[int | None, list[str]]:
    """The image's final USER: it must be numeric and not root (runAsNonRoot can only check a number)."""
    users = [line.split()[1] for line in (root / "deploy/docker/Dockerfile").read_text().splitlines()
             if line.startswith("USER ")]
    if not users:
        return None, ["Dockerfile: no USER (the image runs as root)"]
    uid = users[-1].split(":")[0]
    if not uid.isdigit() or int(uid) == 0:
        return None, [f"Dockerfile: USER {users[-1]} must be a numeric non-root uid"]
    return int(uid), []


# --- compose and monitoring ------------------------------------------------------------------------------------

def check_compose(config: dict, variant: str) -> list[str]:
    problems = []
    services = config.get("services", {})
    for name, service in services.items():
        for port in service.get("ports", []):
            if port.get("host_ip") != "127.0.0.1":
                problems.append(f"compose {name}: port {port.get('published')} published on "
                                f"{port.get('host_ip') or 'every interface'}, not 127.0.0.1")
        image = service.get("image", "")
        if image and (":" not in image or image.endswith(":latest")):
            problems.append(f"compose {name}: image {image} is not pinned")
    problems += _compose_hardening(services)
    commands = {}
    for name in ("gpu-worker", "scheduler", "gateway"):
        service = services.get(name)
        if service is None:
            problems.append(f"compose: no {name} service")
            continue
        env = {k: v for k, v in (service.get("environment") or {}).items() if v is not None}
        try:
            commands[name] = service_config(service["command"], env)
        except (ConfigError, ValueError) as exc:
            problems.append(f"compose {name}: {exc}")
        if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") != "http://jaeger:4317":
            problems.append(f"compose {name}: traces do not go to jaeger:4317")
        if service.get("user") != "10001:10001" or not service.get("read_only"):
            problems.append(f"compose {name}: must run as 10001:10001 on a read-only root filesystem")
    if len(commands) == 3:
        worker, scheduler, gateway = commands["gpu-worker"], commands["scheduler"], commands["gateway"]
        if scheduler.worker_address != f"gpu-worker:{worker.worker_port}":
            problems.append(f"compose scheduler: --worker-address {scheduler.worker_address} is not the worker")
        if gateway.scheduler_address != f"scheduler:{scheduler.scheduler_port}":
            problems.append(f"compose gateway: --scheduler-address {gateway.scheduler_address} is not the scheduler")
        # a TLS port's health needs TLS: its plaintext health-only port then
        for name, port, service_name in (("gpu-worker", worker.worker_health_port if worker.worker_tls else
                                          worker.worker_port, SERVICES["pagedserve.services.gpu_worker"][2]),
                                         ("scheduler", scheduler.health_port if scheduler.tls.serves_tls else
                                          scheduler.scheduler_port, SERVICES["pagedserve.services.scheduler"][2])):
            test = services[name].get("healthcheck", {}).get("test", [])
            if test[-4:] != ["grpc", f"127.0.0.1:{port}", "--service", service_name]:
                problems.append(f"compose {name}: the health check must ask its readiness on its own port "
                                "(its plaintext health port when it serves TLS)")
        if services["gateway"].get("healthcheck", {}).get("test", [])[-1:] != [
                f"http://127.0.0.1:{gateway.port}{HTTP_READINESS}"]:
            problems.append("compose gateway: the health check must GET its /health")
        problems += check_compose_tls(services, commands)
        if variant.endswith("-mtls") and CERTS not in services:
            problems.append(f"compose ({variant}): no {CERTS} service")
        devices = str(services["gpu-worker"].get("deploy", {}))
        variant = variant.removesuffix("-mtls")
        if variant == "gpu" and "'gpu'" not in devices:
            problems.append("compose gpu-worker: no GPU reservation")
        elif variant == "gpu":
            problems += _compose_gpu_count(services["gpu-worker"], worker.worker.tensor_parallel_size)
        if variant == "cpu" and "gpu" in devices:
            problems.append("compose (cpu) gpu-worker: still reserves a GPU")
        for name in ("scheduler", "gateway"):
            grace = _duration_s(services[name].get("stop_grace_period", "10s"))
            drain = float((services[name].get("environment") or {}).get("PAGEDSERVE_DRAIN_TIMEOUT_S") or 0)
            if not drain or grace < drain + 5:
                problems.append(f"compose {name}: stop_grace_period {grace:.0f}s does not cover its drain {drain}s")
        problems += _prometheus_targets(config, scheduler.metrics_port, gateway.port)
    return problems


def _compose_gpu_count(worker: dict, ranks: int) -> list[str]:
    """One GPU reserved for each tensor-parallel rank."""
    devices = worker["deploy"].get("resources", {}).get("reservations", {}).get("devices", [])
    counts = [d.get("count") for d in devices if "gpu" in d.get("capabilities", [])]
    if counts != [ranks]:
        return [f"compose gpu-worker: reserves {counts} GPUs for --tensor-parallel-size {ranks} (one GPU a rank)"]
    return []


def _compose_hardening(services: dict) -> list[str]:
    """Redis runs as its image's user (its entrypoint cannot switch users without capabilities); Grafana has no
    login (so no default admin/admin)."""
    problems = []
    redis = services.get("redis", {})
    if "ALL" in (redis.get("cap_drop") or []) and not redis.get("user"):
        problems.append("compose redis: drops all capabilities without a user: its entrypoint cannot switch to redis")
    grafana = (services.get("grafana", {}).get("environment") or {})
    if grafana.get("GF_AUTH_DISABLE_LOGIN_FORM") != "true" or grafana.get("GF_AUTH_BASIC_ENABLED") != "false":
        problems.append("compose grafana: the login form (default admin/admin) is enabled")
    return problems


def _duration_s(text) -> float:
    if isinstance(text, int | float):  # compose normalises to nanoseconds in JSON
        return text / 1e9
    match = re.match(r"^(?:(\d+)m)?(?:(\d+)s)?$", str(text))
    return 60 * int(match.group(1) or 0) + int(match.group(2) or 0) if match else 0.0


def _prometheus_targets(compose: dict, scheduler_metrics_port: int, gateway_port: int) -> list[str]:
    """The compose Prometheus scrapes the scheduler's /metrics port and the gateway's."""
    mounts = compose["services"].get("prometheus", {}).get("volumes", [])
    source = next((m["source"] for m in mounts if m.get("target") == "/etc/prometheus/prometheus.yml"), None)
    if source is None:
        return ["compose prometheus: no prometheus.yml mounted"]
    targets = {t for job in yaml.safe_load(Path(source).read_text()).get("scrape_configs", [])
               for static in job.get("static_configs", []) for t in static.get("targets", [])}
    wanted = {f"scheduler:{scheduler_metrics_port}", f"gateway:{gateway_port}"}
    return [] if wanted <= targets else [f"prometheus.yml scrapes {sorted(targets)}, not {sorted(wanted)}"]


@functools.cache
def metric_names() -> frozenset[str]:
    """Every metric name the services expose (as Prometheus sees them: counters with _total, histograms' series)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase

    from pagedserve.services.gateway.http.metrics import GatewayMetrics
    from pagedserve.services.gateway.routing.replica_gauges import ReplicaStateCollector
    from pagedserve.services.gateway.routing.router_metrics import RouterMetrics
    from pagedserve.services.gateway.tenants.metrics import TenantMetrics
    from pagedserve.services.scheduler.metrics import SchedulerMetrics
    from pagedserve.shared.scheduler_stats import STATS_FIELDS

    names = {f.metadata["metric"].name + ("_total" if f.metadata["metric"].kind == "counter" else "")
             for f in STATS_FIELDS}
    for metrics in (GatewayMetrics(), RouterMetrics(CollectorRegistry()), TenantMetrics(CollectorRegistry()),
                    SchedulerMetrics(lambda: None)):
        for value in vars(metrics).values():
            if isinstance(value, MetricWrapperBase):
                base = value._name
                kind = value._type
                names |= ({f"{base}_bucket", f"{base}_count", f"{base}_sum"} if kind == "histogram"
                          else {f"{base}_total"} if kind == "counter" else {base})
    no_replicas = SimpleNamespace(replicas=SimpleNamespace(replicas={}), mirror=None,
                                  config=SimpleNamespace(policy="prefix"))
    names |= {family.name for family in ReplicaStateCollector(no_replicas).collect()}
    return frozenset(names)


def dashboard_queries(root: Path) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the pagedserve dashboard."""
    dashboard = json.loads((root / "deploy/grafana/dashboards/pagedserve.json").read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def check_dashboard(root: Path) -> list[str]:
    problems, known = [], metric_names()
    for title, expr in dashboard_queries(root):
        for name in re.findall(r"\b(pagedserve_[a-z0-9_]+)", expr):
            if name not in known:
                problems.append(f"dashboard panel {title!r} reads {name}, which no service exposes")
    datasource = yaml.safe_load((root / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    uids = {d["uid"] for d in datasource["datasources"]}
    dashboard = json.loads((root / "deploy/grafana/dashboards/pagedserve.json").read_text())
    for panel in dashboard["panels"]:
        if panel["datasource"]["uid"] not in uids:
            problems.append(f"dashboard panel {panel['title']!r} uses a datasource Grafana is not given")
    return problems


# --- everything ------------------------------------------------------------------------------------------------

def all_problems(root: Path) -> list[str]:
    """Every check on the deploy files under `root` (a repository checkout or a copy of its deploy files)."""
    problems: list[str] = []
    rendered = {}
    for overlay in OVERLAYS:
        rendered[overlay], found = render(root, overlay)
        problems += found
    problems += validate_schemas(root, rendered)
    image_user, found = dockerfile_user(root)
    problems += found + hadolint(root) + promtool_config(root) + check_dashboard(root)
    for overlay, objects in rendered.items():
        for check in (check_references, check_services, check_probes, check_images, check_draining, check_commands,
                      check_network_policies):
            problems += [f"[{overlay}] {p}" for p in check(objects)]
        problems += [f"[{overlay}] {p}" for p in check_security(objects, image_user)]
        problems += [f"[{overlay}] {p}" for p in check_resources(objects, overlay)]
    from tests.unit.deploy import extension_checks, hardening_checks

    for overlay, objects in rendered.items():
        problems += [f"[{overlay}] {p}" for p in hardening_checks.all_problems(objects, overlay)]
        problems += [f"[{overlay}] {p}" for p in extension_checks.all_problems(objects)]
    for variant in COMPOSE_FILES:
        config, found = compose_config(root, variant)
        problems += found + (check_compose(config, variant) if config else [])
    return problems
