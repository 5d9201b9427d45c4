"""What the model folder says about generation: EOS ids (config.json / generation_config.json)."""

from __future__ import annotations

import json
from pathlib import Path


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def eos_token_ids(model_dir: str | Path) -> tuple[int, ...]:
    """The union of the EOS ids named by generation_config.json and config.json."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        value = _read(Path(model_dir) / name).get("eos_token_id")
        for token_id in value if isinstance(value, list) else [value]:
            if token_id is not None and token_id not in ids:
                ids.append(token_id)
    return tuple(ids)
