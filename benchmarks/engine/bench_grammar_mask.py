"""What grammar masking costs per decode step, and what moving the matchers to the scheduler would add.

Measures, for the default model's vocabulary: filling one constrained row's token bitmask (xgrammar matcher,
positions along a real JSON answer), advancing a matcher by one token, applying the masks of a batch to its
logits, and (the scheduler-side design, as vLLM V1 has it) packing the batch's bitmasks into the step message and
unpacking them on the worker. Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoTokenizer

from pagedserve.services.gpu_worker.grammar import RequestGrammar
from pagedserve.services.gpu_worker.grammar_mask import build_grammar_mask
from pagedserve.services.gpu_worker.model_config import load_model_config
from pagedserve.shared.grammar_cache import GrammarCache
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "servings": {"type": "integer", "minimum": 1, "maximum": 12},
    "vegetarian": {"type": "boolean"},
    "cuisine": {"enum": ["italian", "french", "indian", "asian", "american", "other"]},
    "ingredients": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 1, "maxItems": 4}},
    "required": ["name", "servings", "vegetarian", "cuisine", "ingredients"], "additionalProperties": False}
ANSWER = ('{"name": "Lentil soup with cumin", "servings": 4, "vegetarian": true, "cuisine": "indian", '
          '"ingredients": ["red lentils", "onion", "cumin", "vegetable stock"]}')


def median_us(function, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model folder (its tokenizer and vocabulary)")
    parser.add_argument("--batch", type=int, default=16, help="sampling rows per step")
    parser.add_argument("--constrained", type=int, default=8, help="rows of the batch under a grammar")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    vocab = load_model_config(args.model).vocab_size
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    cache = GrammarCache(args.model, vocab, (tokenizer.eos_token_id,))
    structured = StructuredOutput(StructuredOutputKind.JSON_SCHEMA, json.dumps(SCHEMA))
    compile_start = time.perf_counter()
    compiled = cache.get(structured)
    compile_ms = (time.perf_counter() - compile_start) * 1e3
    answer_ids = tokenizer.encode(ANSWER, add_special_tokens=False)

    # one row's fill, at every position of a real answer
    grammar = RequestGrammar.start(compiled, [])
    bitmask = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)
    fill_us, advance_us = [], []
    for token_id in answer_ids:
        fill_us.append(median_us(lambda: grammar.matcher.fill_next_token_bitmask(bitmask, 0), 20))
        start = time.perf_counter()
        grammar.advance(token_id)
        advance_us.append((time.perf_counter() - start) * 1e6)

    # a whole step's mask: `constrained` rows at spread positions, then applied to [batch, vocab] logits
    grammars: list[RequestGrammar | None] = [None] * args.batch
    for i in range(args.constrained):
        grammars[i * args.batch // args.constrained] = RequestGrammar.start(
            compiled, answer_ids[: (i * 7) % (len(answer_ids) - 1)])
    banned = [()] * args.batch
    build_us = median_us(lambda: build_grammar_mask(grammars, banned, vocab, torch.device("cpu")), args.repeats)
    mask = build_grammar_mask(grammars, banned, vocab, torch.device("cpu"))
    logits = torch.randn(args.batch, vocab)
    apply_us = median_us(lambda: mask.apply(logits.clone()), args.repeats)
    clone_us = median_us(lambda: logits.clone(), args.repeats)

    # the scheduler-side design: the batch's constrained rows travel in the step message
    rows = mask.bitmask[mask.rows].contiguous()
    wire = rows.numpy().tobytes()
    pack_us = median_us(lambda: rows.numpy().tobytes(), args.repeats)
    unpack_us = median_us(lambda: torch.frombuffer(bytearray(wire), dtype=torch.int32).view(len(mask.rows), -1),
                          args.repeats)
    print(json.dumps({
        "vocab_size": vocab, "batch": args.batch, "constrained_rows": args.constrained,
        "compile_ms": round(compile_ms, 1),
        "fill_one_row_us": {"median": round(statistics.median(fill_us), 1), "max": round(max(fill_us), 1),
                            "positions": len(fill_us)},
        "advance_one_token_us": {"median": round(statistics.median(advance_us), 1),
                                 "max": round(max(advance_us), 1)},
        "build_step_mask_us": round(build_us, 1),
        "apply_to_logits_us": round(max(apply_us - clone_us, 0.0), 1),
        "scheduler_side_extra": {"bytes_per_step": len(wire), "pack_us": round(pack_us, 1),
                                 "unpack_us": round(unpack_us, 1)},
    }, indent=2))
    cache.close()


if __name__ == "__main__":
    main()
