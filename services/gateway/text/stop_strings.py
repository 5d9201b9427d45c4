"""Stop strings over streamed text: cut exactly before the first stop string and never let one leak.

"First" is the first to be complete, as generation meets them (of two ending together, the one starting earlier):
with stops "." and "a.a", "aa.a" stops at "aa" whether it arrives whole or as "aa." then "a", since generation
halts at the "." before "a.a" could complete. Text that could be the start of a stop string is held back until the
next piece decides it; at the end of the generation whatever is held is released.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str], include_stop: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.include_stop = include_stop  # the stop string that ended the text stays in it (vLLM's field)
        self._held = ""
        self.stopped = False  # a stop string was found: everything after it is discarded

    def feed(self, text: str, final: bool = False) -> str:
        """The text that is safe to emit now; `final` releases what is held back."""
        if self.stopped:
            return ""
        buffer = self._held + text
        found = [(i + len(s), i) for s, i in ((s, buffer.find(s)) for s in self.stops) if i >= 0]
        if found:
            self.stopped, self._held = True, ""
            end, start = min(found)
            return buffer[:end if self.include_stop else start]
        num_held = 0 if final else self._longest_partial_stop(buffer)
        self._held = buffer[len(buffer) - num_held:] if num_held else ""
        return buffer[:len(buffer) - num_held]

    def _longest_partial_stop(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest
