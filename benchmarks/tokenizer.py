"""The benchmark's view of a tokenizer: encode/decode without special tokens, plus the EOS token ids."""

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer


@dataclass(frozen=True)
class BenchTokenizer:
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]  # read by payload building for the logit_bias EOS suppression
    path: str

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def count(self, text: str) -> int:
        return len(self.encode(text))


def load_tokenizer(path: str) -> BenchTokenizer:
    """Load from a HF tokenizer folder (tokenizer.json + configs) or a tokenizer.json file."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    tokenizer = Tokenizer.from_file(str(file))
    return BenchTokenizer(tokenizer, _eos_token_ids(folder, tokenizer), str(p))


def _eos_token_ids(folder: Path, tokenizer: Tokenizer) -> tuple[int, ...]:
    """Union of the EOS ids named in tokenizer_config.json, generation_config.json and config.json."""
    ids: set[int] = set()
    eos = _read_json(folder / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str) and tokenizer.token_to_id(eos) is not None:
        ids.add(tokenizer.token_to_id(eos))
    for name in ("generation_config.json", "config.json"):
        value = _read_json(folder / name).get("eos_token_id")
        ids.update([value] if isinstance(value, int) else value or [])
    return tuple(sorted(ids))


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
