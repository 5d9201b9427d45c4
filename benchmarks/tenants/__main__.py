"""`python -m pagedserve.benchmarks.tenants`: fair share and priority between tenants on one saturated engine.

Starts `pagedserve serve MODEL_DIR` on free ports with a keys file of four tenants (docs/tenants.md): `a` and `b`
of equal weight, `urgent` of priority class 0 and `bulk` of class 10; by default `--max-num-seqs 4` (a saturated
engine from a few dozen streams), `--max-queue-wait-s 0` (requests queue rather than get a 429) and one worker
thread. Then, in one run:
1. fair share: `a` with ten times `b`'s closed-loop streams (40 against 4: ten times the requests outstanding)
   for `--both-s`, then `b` stops and `a` goes on alone for `--alone-s`;
2. priority, in `--rounds` alternating rounds: `urgent`'s probes one at a time on the idle engine, then the same
   during a flood of `bulk` streams (priority 10, far more than the slots).
Prints the table of report.py with the machine's load average before and after, writes it (JSON and markdown)
to `--out`, exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path

from pagedserve.benchmarks.client import get
from pagedserve.benchmarks.peers.process import ServerProcess, local_pagedserve_spec
from pagedserve.benchmarks.records import RequestRecord
from pagedserve.benchmarks.tenants import accounting
from pagedserve.benchmarks.tenants.report import table, targets
from pagedserve.benchmarks.tenants.traffic import Client, Tenant, closed_loop, probes

KEYS = {"a": "sk-bench-a", "b": "sk-bench-b", "urgent": "sk-bench-urgent", "bulk": "sk-bench-bulk"}
CLASSES = {"a": 0, "b": 0, "urgent": 0, "bulk": 10}
# A saturated engine from a few dozen streams, requests queued rather than refused (no queue-time bound), and one
# worker thread: on a 2-core box shared with the gateway and the clients, two OpenMP threads stall whenever one is
# descheduled (docs/measurements/2026-12-04-overload.md): on the busy box of 2026-12-06 (load 13) the warm-up
# requests' steps took about 1.3 s with two threads, 0.08 s with one.
SERVE_ARGS = "--max-num-seqs 4 --max-queue-wait-s 0 --kv-cache-memory-bytes 536870912 --num-threads 1"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.tenants", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="models/SmolLM2-135M-Instruct")
    p.add_argument("--serve-args", default=SERVE_ARGS,
                   help="`pagedserve serve` flags, one shell-quoted string (the keys file is added)")
    p.add_argument("--b-streams", type=int, default=4, help="b's closed-loop streams; a gets ten times as many")
    p.add_argument("--max-tokens", type=int, default=16, help="of every fair-share and flood request")
    p.add_argument("--settle-s", type=float, default=5.0, help="fair share: not counted at the start")
    p.add_argument("--both-s", type=float, default=60.0)
    p.add_argument("--alone-s", type=float, default=30.0)
    p.add_argument("--flood-streams", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="priority: unloaded / flood rounds, alternating")
    p.add_argument("--probes", type=int, default=8, help="priority probes per round and condition")
    p.add_argument("--probe-gap-s", type=float, default=0.3)
    p.add_argument("--probe-max-tokens", type=int, default=4)
    p.add_argument("--out", default="bench-results/tenants.json")
    p.add_argument("--log-dir", default="bench-results/logs")
    return p


def keys_file(folder: Path) -> Path:
    tenants = {name: {"keys": [key], "priority": CLASSES[name], "weight": 1} for name, key in KEYS.items()}
    path = folder / "keys.json"
    path.write_text(json.dumps({"tenants": tenants}))
    return path


async def fair_share_phase(args: argparse.Namespace, a: Client, b: Client, clock: float) -> dict:
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    start_s = time.perf_counter() - clock
    tasks = [asyncio.create_task(closed_loop(a, 10 * args.b_streams, stop_a)),
             asyncio.create_task(closed_loop(b, args.b_streams, stop_b))]
    before = await _tenant_tokens(a)
    await asyncio.sleep(args.both_s)
    b_stop_s = time.perf_counter() - clock
    stop_b.set()
    await tasks[1]
    after_b = await _tenant_tokens(a)
    await asyncio.sleep(args.alone_s)
    a_stop_s = time.perf_counter() - clock
    stop_a.set()
    await tasks[0]
    figures = accounting.fair_share(a.records, b.records, start_s + args.settle_s, b_stop_s, a_stop_s)
    counted = {t: after_b.get(t, 0.0) - before.get(t, 0.0) for t in ("a", "b")}
    print(f"fair share: {figures}; by the counter {counted} (load {load()})", flush=True)
    return {"figures": figures, "b_stop_s": b_stop_s, "a_stop_s": a_stop_s,
            "counter_b_share": counted["b"] / sum(counted.values()) if sum(counted.values()) else None}


async def priority_phase(args: argparse.Namespace, urgent: Client, bulk: Client) -> dict:
    unloaded: list[RequestRecord] = []
    flooded: list[RequestRecord] = []
    for i in range(args.rounds):
        await probes(urgent, args.probes, args.probe_gap_s, unloaded, first_seq=2 * i * args.probes)
        stop = asyncio.Event()
        flood = asyncio.create_task(closed_loop(bulk, args.flood_streams, stop))
        await asyncio.sleep(3.0)  # every flood stream sent: the queue is deep
        await probes(urgent, args.probes, args.probe_gap_s, flooded, first_seq=(2 * i + 1) * args.probes)
        stop.set()
        await flood
        print(f"priority round {i + 1}: TTFT s unloaded {[r.ttft_s for r in unloaded[-args.probes:]]}, flood "
              f"{[r.ttft_s for r in flooded[-args.probes:]]} (load {load()})", flush=True)
    return {"figures": accounting.priority(unloaded, flooded, bulk.records), "records": unloaded + flooded,
            "unloaded_ttft_s": [r.ttft_s for r in unloaded], "flood_ttft_s": [r.ttft_s for r in flooded]}


async def run(args: argparse.Namespace, base_url: str, model: str) -> dict:
    clock = time.perf_counter()
    clients = {name: Client.open(Tenant(name, key, args.probe_max_tokens if name == "urgent" else args.max_tokens),
                                 base_url, model, clock) for name, key in KEYS.items()}
    warm_up: list[RequestRecord] = []
    try:
        for client in clients.values():  # warm-up: not counted (a fresh server's first requests are slower)
            await asyncio.gather(*(client.send(99, seq, warm_up) for seq in range(2)))
        fair = await fair_share_phase(args, clients["a"], clients["b"], clock)
        prio = await priority_phase(args, clients["urgent"], clients["bulk"])
    finally:
        for client in clients.values():
            await client.close()
    sent = {**{name: c.records for name, c in clients.items()}, "urgent": prio.pop("records"), "warm-up": warm_up}
    failed = {name: dict(Counter(r.error for r in records if not r.ok)) for name, records in sent.items()}
    return {"fair": fair, "priority": prio, "failed": {k: v for k, v in failed.items() if v},
            "requests": {name: len(records) for name, records in sent.items()}}


async def _tenant_tokens(client: Client) -> dict[str, float]:
    reply = await get(client.session, client.endpoint.base_url + "/metrics")
    return accounting.tenant_generated(reply.text)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: the server is stopped on the way out
    started, load_before = datetime.now(UTC).isoformat(timespec="seconds"), load()
    with tempfile.TemporaryDirectory() as tmp:
        serve_args = f"{args.serve_args} --api-keys-file {shlex.quote(str(keys_file(Path(tmp))))}"
        spec = replace(local_pagedserve_spec(args.model_dir, serve_args),
                       headers={"Authorization": f"Bearer {KEYS['a']}"})
        with ServerProcess(spec, Path(args.log_dir) / "tenants.log") as server:
            result = asyncio.run(run(args, spec.base_url, server.model_name()))
    fair, prio = result["fair"]["figures"], result["priority"]["figures"]
    rows = targets(fair, prio, sum(n for kinds in result["failed"].values() for n in kinds.values()))
    header = (f"started {started}; {os.cpu_count()} CPUs; load average (1, 5, 15 min) before {load_before}, after "
              f"{load()}; serve args: {args.serve_args}; a {10 * args.b_streams} streams, b {args.b_streams}, "
              f"{args.max_tokens} tokens each; flood {args.flood_streams} streams")
    counter = result["fair"]["counter_b_share"]
    note = f"B's share by the gateway's per-tenant counter (requests ended before B stopped): {counter:.1%}" \
        if counter is not None else "no per-tenant counter"
    markdown = f"{header}\n\n{table(rows)}\n\n{note}\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(markdown)
    result["fair"]["figures"], result["priority"]["figures"] = asdict(fair), asdict(prio)
    summary = {"started": started, "load_before": load_before, "load_after": load(), "args": vars(args),
               "targets": [{**asdict(t), "ok": t.ok} for t in rows], **result}
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(markdown)
    if result["failed"]:
        print(f"failed requests: {result['failed']}")
    return 0 if all(t.ok for t in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
