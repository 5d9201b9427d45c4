"""services/proto_gen is committed: regenerating it from proto/ must give exactly the committed files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "services" / "proto_gen"


def test_generated_code_matches_the_protos(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    fresh = {p.name: p.read_text() for p in tmp_path.iterdir() if p.is_file()}
    committed = {p.name: p.read_text() for p in COMMITTED.iterdir() if p.is_file()}
    assert sorted(fresh) == sorted(committed), "file sets differ: run `make protos`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"services/proto_gen is stale ({', '.join(stale)}): run `make protos`"


def test_every_enum_starts_with_unspecified():
    from services.proto_gen import common_pb2, scheduler_pb2, worker_pb2

    for module in (common_pb2, scheduler_pb2, worker_pb2):
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            assert enum.values_by_number[0].name.endswith("_UNSPECIFIED"), enum.full_name
