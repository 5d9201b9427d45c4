"""`python -m pagedserve.benchmarks.gguf_code_layouts FILE.gguf`: the int8 GEMM's CPU time on a GGUF file's Q5_0 /
Q5_1 / Q5_K projections packed as 8-bit codes against the same packed as 5-bit codes, in alternating rounds.

Each such tensor is read from its blocks as the loader reads it (one grid a tensor, not fused), packed both ways,
and every tensor of a set runs once per pass through int8_linear.c on the same inputs (standard normal, one outlier
channel at 300 as the default model's hidden states have). A round times one pass set of each layout (their order
alternating round by round) with `time.process_time` on one thread (torch.set_num_threads(1)), which other
processes on a shared machine disturb far less than wall time; run it under `nice -n 19`. The two layouts' outputs
must agree bit for bit, or it stops. Prints per row count the median CPU ms of one pass and each round's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

from pagedserve.kernels.cpu.int8_linear import Int8Linear, Int8Weight, pack_grid
from pagedserve.services.gpu_worker.gguf.blocks import grid_from_blocks

FIVE_BIT_TYPES = (T.Q5_0, T.Q5_1, T.Q5_K)


def five_bit_tensors(path: str) -> dict[str, tuple[Int8Weight, Int8Weight]]:
    """name -> (8-bit packing, 5-bit packing) of each Q5_x tensor of the file."""
    out = {}
    for tensor in GGUFReader(path).tensors:
        if tensor.tensor_type not in FIVE_BIT_TYPES:
            continue
        shape = tuple(int(n) for n in reversed(tensor.shape))
        grid = grid_from_blocks(tensor.data, tensor.tensor_type, *shape)
        eight, five = pack_grid(grid, five_bit=False), pack_grid(grid)
        if (eight.bits, five.bits) != (8, 5):
            raise SystemExit(f"{tensor.name}: packed as {eight.bits} and {five.bits} bits, not 8 and 5")
        out[tensor.name] = (eight, five)
    return out


def inputs(weights: list[Int8Weight], rows: int) -> dict[int, torch.Tensor]:
    generator = torch.Generator().manual_seed(rows)
    out = {}
    for width in sorted({w.in_features for w in weights}):
        x = torch.randn(rows, width, generator=generator)
        x[:, 7] = 300.0
        out[width] = x
    return out


def one_pass(kernel: Int8Linear, weights: list[Int8Weight], x: dict[int, torch.Tensor], passes: int) -> float:
    """CPU ms of one pass over `weights`, averaged over `passes`."""
    start = time.process_time()
    for _ in range(passes):
        for w in weights:
            kernel(x[w.in_features], w, None)
    return (time.process_time() - start) / passes * 1e3


def check_equal(kernel: Int8Linear, pairs: list[tuple[Int8Weight, Int8Weight]], x: dict[int, torch.Tensor]) -> None:
    for eight, five in pairs:
        if not torch.equal(kernel(x[eight.in_features], eight, None), kernel(x[five.in_features], five, None)):
            raise SystemExit("the 5-bit layout's outputs differ from the 8-bit layout's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", help="a GGUF file with Q5_0 / Q5_1 / Q5_K tensors (e.g. the default model's Q4_K_M)")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 1])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=0, help="passes a measurement (0: 160 / rows, at least 4)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pairs = list(five_bit_tensors(args.gguf).values())
    sets = {"8-bit codes": [p[0] for p in pairs], "5-bit codes": [p[1] for p in pairs]}
    for name, weights in sets.items():
        print(f"{name}: {len(weights)} tensors, {sum(w.nbytes() for w in weights) / 2**20:.1f} MiB")
    kernel = Int8Linear()
    for rows in args.rows:
        x = inputs(sets["8-bit codes"], rows)
        check_equal(kernel, pairs, x)
        passes = args.passes or max(4, 160 // rows)
        times: dict[str, list[float]] = {name: [] for name in sets}
        for weights in sets.values():  # warm-up
            one_pass(kernel, weights, x, 1)
        for round_ in range(args.rounds):
            order = list(sets) if round_ % 2 == 0 else list(reversed(sets))
            for name in order:
                times[name].append(one_pass(kernel, sets[name], x, passes))
        for name, values in times.items():
            rounds = ", ".join(f"{v:.2f}" for v in values)
            print(f"{rows} rows, {name}: median {statistics.median(values):.2f} CPU ms a pass ({rounds})")


if __name__ == "__main__":
    main()
