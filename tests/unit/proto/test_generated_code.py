"""services/proto_gen is committed: regenerating it from proto/ must give the committed files, up to the grpc
version stamp (it names the grpcio-tools patch release that ran, which a fresh install moves; the stamp only has to
be no newer than the grpcio runtime, or the modules refuse to import)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "services" / "proto_gen"
_STAMP = re.compile(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", re.MULTILINE)


def _without_stamp(text: str) -> str:
    return _STAMP.sub("GRPC_GENERATED_VERSION = <stamp>", text)


def test_generated_code_matches_the_protos(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    fresh = {p.name: _without_stamp(p.read_text()) for p in tmp_path.iterdir() if p.is_file()}
    committed = {p.name: _without_stamp(p.read_text()) for p in COMMITTED.iterdir() if p.is_file()}
    assert sorted(fresh) == sorted(committed), "file sets differ: run `make protos`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"services/proto_gen is stale ({', '.join(stale)}): run `make protos`"


def test_the_stamp_is_no_newer_than_the_grpc_runtime():
    import grpc
    from grpc._utilities import first_version_is_lower

    stamps = {p.name: _STAMP.search(p.read_text()) for p in COMMITTED.glob("*_pb2_grpc.py")}
    assert stamps and all(stamps.values()), f"no grpc version stamp found in {sorted(stamps)}"
    for name, stamp in stamps.items():
        assert not first_version_is_lower(grpc.__version__, stamp.group(1)), (name, stamp.group(1), grpc.__version__)


def test_every_enum_starts_with_unspecified():
    from pagedserve.services.proto_gen import common_pb2, scheduler_pb2, worker_pb2

    for module in (common_pb2, scheduler_pb2, worker_pb2):
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            assert enum.values_by_number[0].name.endswith("_UNSPECIFIED"), enum.full_name
