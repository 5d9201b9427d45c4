"""Section: issue 38's table of targets, each row judged PASS / FAIL from this run's results, or NOT MEASURED with
the reason; in a dry run the toy-size figures are shown and judged nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pagedserve.benchmarks.device.context import Section
from pagedserve.benchmarks.device.results import Results

Verdict = tuple[str, str]  # (the figure as measured, PASS | FAIL | NOT MEASURED: why)
SMOL, ONE_B = "smollm2-135m", "llama-3.2-1b"
DECODE_MUST = {(1, 8192): 0.7, (16, 8192): 0.95, (64, 2048): 0.95, (256, 8192): 0.95}
PREFILL_MUST = {(1, 8192): 0.8, (4, 8192): 0.8}


@dataclass(frozen=True)
class Target:
    figure: str
    must: str
    judge: Callable[[Results], Verdict]


def _engine(results: Results, shape: str, batch: int, graphs: str = "on") -> dict | None:
    return next((r for r in results.rows("engine") if r.get("shape") == shape and r.get("graphs") == graphs
                 and r.get("batch") == batch and "tok_s" in r), None)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _missing(what: str) -> Verdict:
    return "-", f"NOT MEASURED: {what}"


def graph_tokens(results: Results) -> Verdict:
    rows = [r for r in results.rows("engine") if "tokens_identical" in r]
    if not rows:
        return _missing("no graphs-on and graphs-off pair ran")
    differ = [f"{r['shape']} b{r['batch']}: {r['sequences_differing']} differ" for r in rows
              if not r["tokens_identical"]]
    value = "; ".join(differ) or f"identical in {len(rows)} runs (tokens only; logits not compared here)"
    return value, _verdict(not differ)


def smol_speed(results: Results) -> Verdict:
    one, many = _engine(results, SMOL, 1), _engine(results, SMOL, 256)
    if one is None or many is None:
        return _missing("no graphs-on SmolLM2 run at batch 1 and 256")
    return f"b1 {one['tok_s']:.1f}, b256 {many['tok_s']:.0f} tok/s", _verdict(
        one["tok_s"] >= 200 and many["tok_s"] >= 30_000)


def vs_transformers(results: Results) -> Verdict:
    hf = {r["batch"]: r for r in results.rows("transformers baseline") if r.get("how") == "cuda graph"}
    ours = {b: _engine(results, SMOL, b) for b in (1, 64)}
    if any(ours[b] is None or b not in hf for b in (1, 64)):
        return _missing("needs graphs-on engine runs and graph-captured transformers runs at batch 1 and 64")
    ratios = {b: ours[b]["tok_s"] / hf[b]["tok_s"] for b in (1, 64)}
    return f"b1 {ratios[1]:.2f}x, b64 {ratios[64]:.2f}x", _verdict(ratios[1] >= 0.8 and ratios[64] >= 2)


def one_b_step(results: Results) -> Verdict:
    row = _engine(results, ONE_B, 1)
    info = next((r for r in results.rows("engine") if r.get("shape") == ONE_B and "weight_read_ms" in r), None)
    if row is None or info is None:
        return _missing("no graphs-on 1B run at batch 1")
    bound = 2 * info["weight_read_ms"]
    return f"{row['step_ms']:.3f} ms (bound {bound:.3f} ms)", _verdict(row["step_ms"] <= bound)


def one_b_batch_ratio(results: Results) -> Verdict:
    one, many = _engine(results, ONE_B, 1), _engine(results, ONE_B, 64)
    if one is None or many is None:
        return _missing("no graphs-on 1B run at batch 1 and 64")
    ratio = many["step_ms"] / one["step_ms"]
    return f"{ratio:.2f}x", _verdict(ratio <= 1.4)


def _attention(results: Results, kind: str, must: dict[tuple[int, int], float]) -> Verdict:
    rows = {(r["batch"], r["context"]): r for r in results.rows("attention kernels") if r.get("kind") == kind}
    parts, ok, missing = [], True, []
    for size, floor in must.items():
        row = rows.get(size)
        if row is None or row.get("triton_speed_vs_flash") is None:
            missing.append(f"{size[0]}x{size[1]}")
            continue
        speed = row["triton_speed_vs_flash"]
        cudnn = row.get("triton_speed_vs_cudnn")
        parts.append(f"{size[0]}x{size[1]} {speed:.2f}x" + (f" (vs cuDNN {cudnn:.2f}x)" if cudnn else "")
                     + ("" if row["triton_how"] == "graph" else f" [{row['triton_how']}]"))
        ok = ok and speed >= floor
    value = "; ".join(parts) or "-"
    if ok and missing:  # a measured size below its floor fails the row whatever is missing
        return value, f"NOT MEASURED: {', '.join(missing)}"
    return value, _verdict(ok)


def capture(results: Results) -> Verdict:
    builds = {(r["shape"], r["graphs"]): r for r in results.rows("engine") if "init_s" in r}
    parts, ok = [], True
    for shape in (SMOL, ONE_B):
        on, off = builds.get((shape, "on")), builds.get((shape, "off"))
        if on is None or off is None or "reserved_gib" not in on:
            continue
        seconds, pool = on["init_s"] - off["init_s"], on["reserved_gib"] - off["reserved_gib"]
        parts.append(f"{shape}: ~{seconds:.1f} s, ~{pool:.2f} GiB (build on - off)")
        ok = ok and seconds <= 20 and pool <= 1
    if not parts:
        return _missing("no graphs-on and graphs-off builds on CUDA")
    return "; ".join(parts), _verdict(ok)


TARGETS = [
    Target("graph replay vs eager, every captured size", "identical tokens (greedy, 64 steps)", graph_tokens),
    Target("SmolLM2 shape, decode tok/s, graphs on", "b1 >= 200; b256 >= 30,000", smol_speed),
    Target("same, vs transformers StaticCache + CUDA graph", ">= 0.8x at b1, >= 2x at b64", vs_transformers),
    Target("1B shape, batch-1 step", "<= 2.0x its weight-read time at 4.8 TB/s", one_b_step),
    Target("1B shape, batch-64 step vs batch-1 step", "<= 1.4x", one_b_batch_ratio),
    Target("paged decode, graph-timed, cold L2, vs FLASH", "1x8k >= 0.7x; 16x8k, 64x2k, 256x8k >= 0.95x",
           lambda r: _attention(r, "decode", DECODE_MUST)),
    Target("prefill vs SDPA FLASH", "1x8k and 4x8k >= 0.8x; cuDNN beside",
           lambda r: _attention(r, "prefill", PREFILL_MUST)),
    Target("capture", "all sizes <= 20 s incl. Triton warm-up; pool <= 1 GiB", capture),
]


def run(section: Section) -> str | None:
    results = section.state.results
    print(f"{'figure':<48} {'must':<46} {'verdict':<14} measured")
    for target in TARGETS:
        value, verdict = target.judge(results)
        if section.dry_run and not verdict.startswith("NOT MEASURED"):
            verdict = "DRY RUN"  # toy sizes: the figure shows the plumbing works, it judges nothing
        results.targets.append({"figure": target.figure, "must": target.must, "verdict": verdict,
                                "measured": value})
        print(f"{target.figure:<48} {target.must:<46} {verdict:<14} {value}", flush=True)
    results.save()
    return None
