"""What speculative decoding counts: drafts, draft tokens, accepted tokens, and acceptance per draft position."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeCounters:
    num_drafts: int = 0  # verified draft runs (one per request and step that carried drafts)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_per_position: list[int] = field(default_factory=list)  # [i]: drafts whose token i was accepted

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.num_accepted_per_position) < num_draft_tokens:
            self.num_accepted_per_position.extend([0] * (num_draft_tokens - len(self.num_accepted_per_position)))
        for position in range(num_accepted):
            self.num_accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
