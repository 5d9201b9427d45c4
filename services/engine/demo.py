"""Generate a greedy answer to one chat prompt with the in-process engine (until the services run it)."""

from __future__ import annotations

import argparse

from services.engine.llm import LLM
from services.gpu_worker.worker_config import WorkerConfig
from shared.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("prompt")
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    llm = LLM(WorkerConfig(model_dir=args.model, kv_cache_memory_bytes=256 * 1024**2))
    [completion] = llm.generate([llm.chat_prompt(args.prompt)], SamplingParams(temperature=0.0,
                                                                                max_tokens=args.max_tokens))
    print(completion.text)


if __name__ == "__main__":
    main()
