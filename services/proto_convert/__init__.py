"""Protobuf <-> domain dataclass converters: the only code outside the servicers that touches proto messages."""
