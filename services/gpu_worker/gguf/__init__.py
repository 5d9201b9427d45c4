"""Serving GGUF checkpoints: their quantized blocks as weight grids, their tensor names as DecoderLM's."""
