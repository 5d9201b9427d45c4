"""Decode steps replayed as captured graphs: one graph per padded batch size, fed through static device buffers."""
