"""How llama-server is built: AMX kept out where the CPU has it, and a cached build with other flags redone."""

import json

from pagedserve.benchmarks.peers import llama_build
from pagedserve.benchmarks.peers.llama_build import CMAKE_FLAGS, built_flags, cmake_flags, cpu_flags


def test_amx_is_compiled_out_only_where_the_cpu_has_it():
    assert cmake_flags({"avx512f", "avx512_vnni"}) == CMAKE_FLAGS
    flags = cmake_flags({"avx512f", "amx_tile", "amx_int8", "amx_bf16"})
    assert flags[: len(CMAKE_FLAGS)] == CMAKE_FLAGS
    for var in ("CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS"):
        value = next(f for f in flags if f.startswith(f"-D{var}=")).split("=", 1)[1]
        assert set(value.split()) == {"-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"}


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_tile\nbugs\t\t: spectre_v1\n")
    assert cpu_flags(str(cpuinfo)) == {"fpu", "avx512f", "amx_tile"}
    assert cpu_flags(str(tmp_path / "missing")) == set()


def test_a_build_from_before_flags_were_recorded_counts_as_the_plain_flags(tmp_path):
    assert built_flags(tmp_path) == list(CMAKE_FLAGS)
    (tmp_path / "llama-build.json").write_text(json.dumps({"version": "0.3.36", "build_s": 243, "jobs": 2}))
    assert built_flags(tmp_path) == list(CMAKE_FLAGS)


def test_a_cached_build_with_other_flags_is_rebuilt(tmp_path, monkeypatch):
    binary = llama_build.llama_server_path(tmp_path)
    binary.parent.mkdir(parents=True)
    binary.write_text("old build")
    (tmp_path / "llama.cpp" / "CMakeLists.txt").write_text("")
    (tmp_path / "llama-build.json").write_text(json.dumps({"cmake_flags": list(CMAKE_FLAGS)}))
    commands = []

    def fake_run(argv, log):
        commands.append(argv)
        if "--build" in argv:
            binary.parent.mkdir(parents=True, exist_ok=True)
            binary.write_text("new build")

    monkeypatch.setattr(llama_build, "_run", fake_run)
    monkeypatch.setattr(llama_build, "cpu_flags", lambda: {"amx_tile"})
    assert llama_build.ensure_llama_server(tmp_path) == binary
    assert binary.read_text() == "new build" and len(commands) == 2
    recorded = json.loads((tmp_path / "llama-build.json").read_text())["cmake_flags"]
    assert recorded == list(cmake_flags({"amx_tile"})) and commands[0][-len(recorded):] == recorded

    commands.clear()  # the same flags again: the cached binary
    assert llama_build.ensure_llama_server(tmp_path) == binary and commands == []
