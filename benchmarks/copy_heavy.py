"""The copy-heavy dataset: "fix this function" prompts whose answers repeat most of the prompt.

Real traffic copies from its prompt (code edits, RAG quotes, rewrites); there n-gram speculative decoding accepts
most drafts. Each prompt holds a generated Python function of about `random_input_len` tokens with one planted
bug and asks for the whole corrected function back.
"""

from __future__ import annotations

import numpy as np

from pagedserve.benchmarks.tokenizer import BenchTokenizer

_NAMES = ("total", "count", "price", "weight", "score", "offset", "limit", "ratio", "index", "budget", "margin",
          "length", "height", "width", "depth", "speed", "delay", "quota", "level", "bonus")
_OPS = ("+", "-", "*", "//", "%")


def _function(rng: np.random.Generator, num_lines: int) -> str:
    names = [str(n) for n in rng.choice(_NAMES, size=3, replace=False)]
    lines = [f"def update_{names[0]}_{int(rng.integers(100))}(items, {names[1]}, {names[2]}):",
             f'    """Fold the items into {names[0]}, bounded by {names[2]}."""', f"    {names[0]} = 0"]
    for k in range(max(1, num_lines - 5)):
        a, b = (str(n) for n in rng.choice(_NAMES, size=2, replace=False))
        op, c = str(rng.choice(_OPS)), int(rng.integers(1, 50))
        lines.append(f"    for {a} in items[{k}::{c}]:" if k % 4 == 0 else
                     f"        {names[0]} = ({names[0]} {op} {a} * {c}) if {a} > {names[1]} else {names[0]} + {c}"
                     if k % 4 in (1, 2) else f"        {b} = min({names[2]}, {names[0]} {op} {c})")
    lines += [f"    if {names[0]} > {names[2]}:", f"        {names[0]} = {names[2]} + 1  # BUG: off by one",
              f"    return {names[0]}"]
    return "\n".join(lines)


def copy_heavy_prompts(tokenizer: BenchTokenizer, rng: np.random.Generator, input_lens: list[int]
                       ) -> list[tuple[str, int]]:
    """(prompt, its token count) per requested length; about 14 tokens a line of code."""
    prompts = []
    for input_len in input_lens:
        code = _function(rng, max(6, input_len // 14))
        prompt = ("Fix the off-by-one bug in this function. Answer with the whole corrected function and "
                  f"nothing else.\n\n```python\n{code}\n```")
        prompts.append((prompt, tokenizer.count(prompt)))
    return prompts
