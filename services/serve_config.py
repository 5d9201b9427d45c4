"""`pagedserve serve`'s flags: its own, plus every flag of the services it starts, derived from their configs.

Each service's flags come from its config dataclass (shared/cli_config.py), so a field added to a service is a
`serve` flag too, without editing this file. A flag several services share (`--log-level`) goes to all of them.
The launcher owns the wiring between the services (their internal addresses), so those fields are not flags here;
it passes each child only the flags given to `serve` (PAGEDSERVE_* variables reach the children by inheritance),
and secrets (`*_key`, `*_token`) through the environment, where `ps` does not show them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.gpu_worker.service_config import WorkerServiceConfig
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.shared.cli_config import (
    ConfigError,
    ConfigHelpFormatter,
    add_config_arguments,
    config_from_args,
    env_name,
    flag_name,
    leaf_fields,
    normalize_bool_flags,
)

# name -> (config class, module run with `python -m`, help group title); children start in this order
SERVICES: dict[str, tuple[type, str, str]] = {
    "worker": (WorkerServiceConfig, "pagedserve.services.gpu_worker", "worker: model, KV cache, device"),
    "scheduler": (SchedulerServiceConfig, "pagedserve.services.scheduler",
                  "scheduler: batching, KV blocks, prefix cache, Redis"),
    "gateway": (GatewayConfig, "pagedserve.services.gateway", "gateway: HTTP, OpenAI API, tokenizer, chat template"),
}
INTERNAL_HOST = "127.0.0.1"  # the worker's and the scheduler's gRPC servers listen here under `serve`
# Fields the launcher sets itself: where the internal servers listen and how the services find each other.
WIRING = ("worker_host", "scheduler_host", "worker_address", "scheduler_address")
# Flags of serve, but moved by it when taken (see launcher); always passed to the child
INTERNAL_PORTS = ("scheduler_port", "worker_port", "metrics_port")
SECRET_SUFFIXES = ("_key", "_token")
SECRET_NAMES = ("redis_url",)  # may hold the Redis password
DESCRIPTION = "start worker, scheduler and gateway for MODEL_DIR, wait until they are healthy, stop them together"
EPILOG = """Every flag is also a PAGEDSERVE_* variable (shown with each flag; a flag beats the variable, which beats
the default). Bool flags work bare (--enable-prefix-caching), with a value (--enable-prefix-caching false) and
negated (--no-enable-prefix-caching). vLLM's names are accepted where pagedserve has the concept: see
docs/configuration.md."""


@dataclass(frozen=True)
class LauncherConfig:
    model_dir: str  # Hugging Face model folder to serve (config.json, tokenizer, *.safetensors), or a *.gguf file
    startup_timeout_s: float = 600.0  # give up when the gateway is not healthy by then
    stop_timeout_s: float = 15.0  # per service, before SIGKILL
    replicas: int = 1  # engine replicas (scheduler + worker pairs) started here; the gateway routes over them

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {self.replicas}")


@dataclass(frozen=True)
class ServeConfig:
    """What `serve` was asked for: its own settings, each service's config, and the flags given for them."""

    launcher: LauncherConfig
    services: dict[str, object]  # service name -> its config (validated, with the default wiring)
    given: dict[str, str] = field(default_factory=dict)  # field -> text given on the command line
    explicit: frozenset[str] = frozenset()  # fields set by a flag or a PAGEDSERVE_* variable

    @property
    def gateway(self) -> GatewayConfig:
        return self.services["gateway"]  # type: ignore[return-value]

    @property
    def scheduler(self) -> SchedulerServiceConfig:
        return self.services["scheduler"]  # type: ignore[return-value]

    @property
    def worker(self) -> WorkerServiceConfig:
        return self.services["worker"]  # type: ignore[return-value]


def service_fields() -> dict[str, list[str]]:
    """Field name -> the services that have it, in start order (wiring left out)."""
    owners: dict[str, list[str]] = {}
    for name, (cls, _, _) in SERVICES.items():
        for f, _ in leaf_fields(cls):
            if f.name not in WIRING:
                owners.setdefault(f.name, []).append(name)
    return owners


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, usage="%(prog)s MODEL_DIR [flags]", description=DESCRIPTION,
                                     epilog=EPILOG, allow_abbrev=False, formatter_class=ConfigHelpFormatter)
    owners = service_fields()
    launcher = parser.add_argument_group("serve")
    add_config_arguments(launcher, LauncherConfig, positional=("model_dir",))
    shared = {name for name, services in owners.items() if len(services) > 1 and name != "model_dir"}
    if shared:
        group = parser.add_argument_group("shared: passed to every service that has it")
        for name in sorted(shared):
            cls = SERVICES[owners[name][0]][0]
            add_config_arguments(group, cls, only=lambda n, name=name: n == name,
                                 note={name: f" ({', '.join(owners[name])})"})
    for service, (cls, _, title) in SERVICES.items():
        add_config_arguments(parser.add_argument_group(title), cls,
                             only=lambda n, service=service: owners.get(n) == [service])
    return parser


def _wiring(scheduler_port: int, worker_port: int) -> dict[str, str]:
    return {"worker_host": INTERNAL_HOST, "scheduler_host": INTERNAL_HOST, "worker_address":
            f"{INTERNAL_HOST}:{worker_port}", "scheduler_address": f"{INTERNAL_HOST}:{scheduler_port}"}


def parse_serve_config(argv: Sequence[str] | None, prog: str | None = None,
                       environ: Mapping[str, str] | None = None) -> ServeConfig:
    """Flags + environment -> ServeConfig, every service's config checked (exits 2 naming the flag on bad input)."""
    environ = os.environ if environ is None else environ
    parser = build_parser(prog)
    args = parser.parse_args(normalize_bool_flags(parser, sys.argv[1:] if argv is None else argv))
    given = {name: value for name, value in vars(args).items() if value is not None}
    try:
        launcher = config_from_args(LauncherConfig, args, environ)
        services = {name: config_from_args(cls, args, environ) for name, (cls, _, _) in SERVICES.items()}
    except (ConfigError, ValueError) as exc:
        parser.error(str(exc))
    explicit = frozenset(name for name in service_fields() if name in given or env_name(name) in environ)
    config = ServeConfig(launcher, services, given, explicit)
    if not config.scheduler.internal_token:  # a random one: the services' gRPC ports then serve only each other
        token = secrets.token_urlsafe(32)
        config = dataclasses.replace(config, given={**given, "internal_token": token}, services={
            name: _replaced(service, {"internal_token": token}) for name, service in services.items()})
    return with_ports(config, config.scheduler.scheduler_port, config.worker.worker_port)


def with_ports(config: ServeConfig, scheduler_port: int, worker_port: int) -> ServeConfig:
    """The config with the internal servers on these ports of INTERNAL_HOST and the clients pointed at them."""
    values = {**_wiring(scheduler_port, worker_port), "scheduler_port": scheduler_port, "worker_port": worker_port}
    services = {name: _replaced(service, values) for name, service in config.services.items()}
    return dataclasses.replace(config, services=services)


def _replaced(service: object, values: Mapping[str, object]) -> object:
    names = {f.name for f in dataclasses.fields(service)}
    return dataclasses.replace(service, **{k: v for k, v in values.items() if k in names})


def child_command(config: ServeConfig, service: str) -> list[str]:
    """`python -m <module> [MODEL_DIR] --flag value ...` for one service: the wiring, then the flags given."""
    cls, module, _ = SERVICES[service]
    positional, flags = [], []
    for f, _ in leaf_fields(cls):
        if f.name == "model_dir":
            positional.append(config.launcher.model_dir)
        elif f.name in (*WIRING, *INTERNAL_PORTS):  # top-level fields of the service configs
            flags += [flag_name(f.name), str(getattr(config.services[service], f.name))]
        elif f.name in config.given and not is_secret(f.name):
            flags += [flag_name(f.name), config.given[f.name]]
    return [sys.executable, "-m", module, *positional, *flags]


def child_environment(config: ServeConfig, base: Mapping[str, str]) -> dict[str, str]:
    """The children's environment: ours, unbuffered output, and secrets given as flags (never on a command line)."""
    hidden = {env_name(name): value for name, value in config.given.items() if is_secret(name)}
    return {**base, "PYTHONUNBUFFERED": "1", **hidden}


def is_secret(name: str) -> bool:
    return name.endswith(SECRET_SUFFIXES) or name in SECRET_NAMES
