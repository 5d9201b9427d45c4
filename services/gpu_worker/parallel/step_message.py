"""What rank 0 broadcasts to the other tensor-parallel ranks once per step."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.shared.step_protocol import StepInput


@dataclass
class StepMessage:
    """A step as rank 0 runs it, and what its previous step sampled (the other ranks have no logits). `step` None
    with `stop` False is a keepalive: an idle engine still broadcasts within the collective timeout."""

    step: StepInput | None = None
    scheduled: dict[str, int] = field(default_factory=dict)  # request -> tokens, in rank 0's row order
    failed: list[str] = field(default_factory=list)  # requests rank 0 dropped while applying the deltas
    sampled: list[tuple[str, int]] = field(default_factory=list)  # the previous step's samples, in order
    dropped: list[str] = field(default_factory=list)  # requests the previous step failed in sampling
    stop: bool = False
