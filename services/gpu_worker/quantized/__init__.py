"""Serving pre-quantized safetensors checkpoints (GPTQ / AWQ int4, FP8): their tensors as weight grids or dequantized
weights under the Hugging Face names the loader maps to DecoderLM."""
