"""Cross-checks of the compose stack's internal mutual TLS (deploy/compose.mtls.yml) on the resolved `docker compose
config`: when a hop's server serves TLS, its client dials TLS with a certificate, each service's TLS files lie in a
volume mounted read-only that internal-certs writes for that service with the usage the service needs (and, for a
server, the name its client dials), the services start after internal-certs, and probes of a TLS port use the
plaintext health-only port (the health check test itself is checked by deploy_checks.check_compose)."""

from __future__ import annotations

import shlex

CERTS = "internal-certs"
TLS_FIELDS = ("internal_tls_cert", "internal_tls_key", "internal_tls_ca")


def check_compose_tls(services: dict, configs: dict) -> list[str]:
    """`configs`: compose service name -> its parsed service config (gpu-worker, scheduler, gateway)."""
    worker, scheduler, gateway = configs["gpu-worker"], configs["scheduler"], configs["gateway"]
    if not (worker.worker_tls or scheduler.tls.serves_tls or scheduler.worker_tls or gateway.tls.dials_tls):
        return [] if CERTS not in services else [f"compose: {CERTS} runs, but no service uses TLS"]
    leaves, problems = _issued(services.get(CERTS))
    hops = (("gateway", gateway.tls, "scheduler", scheduler.tls.serves_tls, scheduler.tls.internal_tls_ca,
             gateway.scheduler_address), ("scheduler", scheduler.tls if scheduler.worker_tls else None, "gpu-worker",
                                          worker.worker_tls, worker.tls.internal_tls_ca, scheduler.worker_address))
    for client, client_tls, server, serves, server_ca, address in hops:
        if not serves or client_tls is None or not client_tls.dials_tls:
            problems.append(f"compose {client} -> {server}: not mutual TLS (server TLS {bool(serves)}, client TLS "
                            f"{client_tls is not None and client_tls.dials_tls})")
            continue
        if not server_ca or not client_tls.internal_tls_cert:
            problems.append(f"compose {client} -> {server}: no client certificate required or presented")
        # a gateway resolves a scheduler's DNS name and dials each address (replicas): without the override its
        # TLS checks an IP; the scheduler dials its worker's address as given
        host = address.rsplit(":", 1)[0]
        name = client_tls.internal_tls_server_name or (host if client == "scheduler" else None)
        if name is None:
            problems.append(f"compose {client}: dials the addresses {host!r} resolves to, so TLS checks an IP: set "
                            f"--internal-tls-server-name {server}")
        elif name != server:
            problems.append(f"compose {client}: checks the name {name!r}, but {server}'s certificate names {server!r}")
        problems += _usage(leaves, client, "client") + _usage(leaves, server, "server")
    for name, tls in (("gpu-worker", worker.tls), ("scheduler", scheduler.tls), ("gateway", gateway.tls)):
        problems += _files(services[name], name, tls)
    if scheduler.tls.serves_tls and not scheduler.health_port:
        problems.append("compose scheduler: serves TLS without --health-port for its plaintext health check")
    if worker.worker_tls and not worker.worker_health_port:
        problems.append("compose gpu-worker: serves TLS without --worker-health-port for its plaintext health check")
    return problems


def _issued(certs: dict | None) -> tuple[dict[str, set[str]], list[str]]:
    """internal-certs' leaves (folder name -> usages) from its command, and problems with the service itself."""
    if certs is None:
        return {}, [f"compose: TLS files, but no {CERTS} service makes them"]
    command = certs.get("command") or []
    if "deploy/scripts/internal_certs.py" not in " ".join(command) or "--out" not in command:
        return {}, [f"compose {CERTS}: does not run deploy/scripts/internal_certs.py --out: {shlex.join(command)}"]
    out = command[command.index("--out") + 1]
    leaves = {}
    for arg in command:
        name, colon, usage = arg.partition(":")
        if colon and not arg.startswith(("/", "-")) and "/" not in name:
            leaves[name] = set(usage.split("+"))
    mounted = {m["target"]: m.get("source") for m in certs.get("volumes", [])}
    problems = [f"compose {CERTS}: writes {out}/{name} elsewhere than the volume internal-tls-{name}"
                for name in leaves if mounted.get(f"{out}/{name}") != f"internal-tls-{name}"]
    if certs.get("restart") not in (None, "no"):
        problems.append(f"compose {CERTS}: a one-shot job must not restart (restart {certs.get('restart')})")
    return leaves, problems


def _usage(leaves: dict[str, set[str]], name: str, usage: str) -> list[str]:
    if usage in leaves.get(name, set()):
        return []
    return [f"compose {CERTS}: makes no {usage} certificate for {name} (it makes {sorted(leaves.get(name, []))})"]


def _files(service: dict, name: str, tls) -> list[str]:
    """The service's TLS files come, read-only, from the volume internal-certs writes for it; it starts after."""
    paths = [getattr(tls, f) for f in TLS_FIELDS if getattr(tls, f)]
    if not paths:
        return []
    problems = []
    if (service.get("depends_on") or {}).get(CERTS, {}).get("condition") != "service_completed_successfully":
        problems.append(f"compose {name}: does not wait for {CERTS} to complete")
    for path in paths:
        mount = next((m for m in service.get("volumes", []) if path.startswith(m["target"].rstrip("/") + "/")), None)
        if mount is None:
            problems.append(f"compose {name}: {path} is in no mounted volume")
        elif mount.get("source") != f"internal-tls-{name}" or not mount.get("read_only"):
            problems.append(f"compose {name}: {path} must come read-only from the volume internal-tls-{name} "
                            f"(mounted: {mount.get('source')}, read_only {bool(mount.get('read_only'))})")
    return problems
