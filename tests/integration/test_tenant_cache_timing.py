"""Cross-tenant prefix-cache timing probe on the real default model (`pagedserve serve` with two tenants).

A client of tenant B tries to learn whether tenant A sent a prompt by timing its own request for it. For each pair
a fresh long prompt is sent by A (not timed), then B times two requests in random order: that prompt ("another
tenant cached it") and another fresh prompt ("nobody did"). Every request carries the same `cache_salt`, so B also
copies A's salt. The probe's power to tell them apart is the ROC AUC (Mann-Whitney) of the two TTFT samples:
AUC = P(TTFT_cross < TTFT_fresh), ties counting half; 1.0 would say a cross-tenant hit is always faster, 0.5
that the probe learns nothing. Every cross request must report `cached_tokens == 0` and the AUC must be <= 0.55.
A control proves the probe can see a hit: B sending its own prompt again (a within-tenant hit, `cached_tokens > 0`)
against the fresh prompts must give an AUC >= 0.7 (30 hits vs 100 fresh: 3.3 null sds above 0.5; observed 0.75
and 0.94 at 512 tokens under load, slow outliers of hits being what keeps it below 1). The prompts are long so
that a hit saves a lot: a hit computes the last 16 of 512 tokens. At 128 tokens on the shared 2-core machine under
load ~15 the control only reached 0.61 (hit median 4.5 s, fresh 6.0 s: fixed per-request costs under load drown a
112-token saving), see docs/measurements/2026-12-06-tenant-cache-timing.md.

Sampling noise, and why the test may measure more than 100 pairs. Cross-tenant blocks are never shared, so both
samples come from identical work (one 512-token prefill plus one sampled token): under that null hypothesis the
Mann-Whitney statistic's distribution is distribution-free for independent continuous samples, with mean 0.5 and
variance (n1 + n2 + 1) / (12 n1 n2) = 201 / 120000, a standard deviation of 0.041 for 100 pairs. The bound 0.55 is
then 1.22 standard deviations out: a leak-free server exceeds it in about 11% of 100-pair runs, too often for a
test. So the test is sequential: after 100 pairs it passes when AUC <= 0.55 (the issue's figure, ~89% of runs),
otherwise it measures 300 pairs more and asserts AUC <= 0.55 over all 400 (standard deviation 0.020, the bound
2.45 of them out: ~0.7% alone, ~0.5% jointly with the first stage; 4,000 simulated leak-free runs gave sd 0.041,
11.0% over 0.55 at 100 pairs and 0.53% failing both stages). A leak (A's blocks served to B) would give
an AUC near the control's at both stages and fail. Time to first token is the client's latency of a
non-streamed request with `max_tokens: 1`, so it includes everything a client can time.

Run time: about 340 requests, serially but for A's (5 at a time). At 128 tokens the run took 30 min on the shared
2-core machine under load ~15; 512-token prefills cost more. The extension, when it happens, adds about 3x that.
Hence `slow` and a long timeout.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest

from tests.integration.processes import MODEL_DIR, REPO, free_port, wait_for

# ~340 requests serially: 30 min at 128 tokens under load ~15 on 2 cores; the 400-pair extension is ~4x that
pytestmark = [pytest.mark.slow, pytest.mark.timeout(7200)]

KEYS = {"tenants": {"team-a": {"keys": ["sk-a"]}, "team-b": {"keys": ["sk-b"]}}}
PROMPT_TOKENS = 512  # 32 blocks of 16: a hit serves 496 tokens and computes the last block's 16
FIRST_PAIRS, MORE_PAIRS, CONTROL_PAIRS = 100, 300, 30
ROUND = 5  # pairs whose A requests go together
AUC_BOUND, CONTROL_AUC_MIN = 0.55, 0.7
SALT = "copied-salt"  # every request sends it: B copies A's salt


def auc(faster: list[float], slower: list[float]) -> float:
    """P(x < y) for x from `faster`, y from `slower`, ties counting half (the Mann-Whitney U over n1 n2)."""
    wins = sum((x < y) + 0.5 * (x == y) for x in faster for y in slower)
    return wins / (len(faster) * len(slower))


@dataclass
class Samples:
    cross: list[float] = field(default_factory=list)  # B's TTFT for a prompt A sent just before
    fresh: list[float] = field(default_factory=list)  # B's TTFT for a prompt nobody sent
    hit: list[float] = field(default_factory=list)  # B's TTFT for a prompt it sent itself (control)


@contextlib.contextmanager
def serving(tmp_path) -> Iterator[str]:
    keys_path = tmp_path / "keys.json"
    keys_path.write_text(json.dumps(KEYS))
    port = free_port()
    argv = [sys.executable, "-m", "pagedserve.services.cli", "serve", str(MODEL_DIR), "--port", str(port),
            "--scheduler-port", str(free_port()), "--worker-port", str(free_port()), "--metrics-port",
            str(free_port()), "--api-keys-file", str(keys_path), "--kv-cache-memory-bytes", "256MiB",
            "--max-model-len", "1024", "--max-queue-wait-s", "0"]  # no 429 for A's burst on a loaded machine
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        def healthy() -> bool:
            assert process.poll() is None, log_path.read_text()[-4000:]
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            return False

        wait_for(healthy, 600, interval_s=0.5, what="the stack's /health")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Probe:
    def __init__(self, client: httpx.Client, seed: int) -> None:
        self.client = client
        self.rng = random.Random(seed)
        self.samples = Samples()

    def prompt(self) -> list[int]:
        """A prompt nobody sent: random token ids (two such prompts share no block)."""
        return [self.rng.randrange(1000, 40000) for _ in range(PROMPT_TOKENS)]

    def ask(self, key: str, prompt: list[int]) -> tuple[float, int]:
        """(seconds to the answer of a one-token completion, its cached prompt tokens)."""
        body = {"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 1, "cache_salt": SALT}
        start = time.perf_counter()
        response = self.client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        elapsed = time.perf_counter() - start
        assert response.status_code == 200, response.text
        details = response.json()["usage"].get("prompt_tokens_details") or {}
        return elapsed, details.get("cached_tokens") or 0

    def pairs(self, count: int, with_control: int = 0) -> None:
        for start in range(0, count, ROUND):
            prompts = [self.prompt() for _ in range(min(ROUND, count - start))]
            with ThreadPoolExecutor(len(prompts)) as pool:  # A caches them (not timed)
                assert all(c == 0 for _, c in pool.map(lambda p: self.ask("sk-a", p), prompts))
            for index, prompt in enumerate(prompts):
                for kind in self.rng.sample(["cross", "fresh"], 2):
                    elapsed, cached = self.ask("sk-b", prompt if kind == "cross" else self.prompt())
                    assert cached == 0, f"{kind}: tenant B got {cached} cached tokens"
                    getattr(self.samples, kind).append(elapsed)
                if start + index < with_control:  # B's own prompt again: a hit the probe must see
                    elapsed, cached = self.ask("sk-b", prompt)
                    assert cached == PROMPT_TOKENS - 16, cached
                    self.samples.hit.append(elapsed)


def test_a_timing_probe_cannot_tell_another_tenants_cached_prompt_from_a_fresh_one(tmp_path):
    with serving(tmp_path) as base_url, httpx.Client(base_url=base_url, timeout=300) as client:
        probe = Probe(client, seed=41)
        probe.ask("sk-a", probe.prompt())  # the first request warms the stack up: not a sample
        probe.pairs(FIRST_PAIRS, with_control=CONTROL_PAIRS)
        samples = probe.samples
        first_auc = auc(samples.cross, samples.fresh)
        control_auc = auc(samples.hit, samples.fresh)
        report = {"pairs": len(samples.cross), "auc_cross_vs_fresh": round(first_auc, 3),
                  "auc_control_hit_vs_fresh": round(control_auc, 3),
                  "median_s": {k: round(sorted(v)[len(v) // 2], 4) for k, v in vars(samples).items()}}
        print("tenant cache timing probe:", json.dumps(report), flush=True)
        if first_auc > AUC_BOUND:  # ~11% of leak-free runs: decide on 400 pairs (see the module docstring)
            probe.pairs(MORE_PAIRS)
            report |= {"pairs": len(samples.cross), "auc_cross_vs_fresh": round(auc(samples.cross, samples.fresh), 3)}
            print("tenant cache timing probe, extended:", json.dumps(report), flush=True)
    assert control_auc >= CONTROL_AUC_MIN, report  # the probe does see a hit
    assert auc(samples.cross, samples.fresh) <= AUC_BOUND, report
