"""Text on the gateway: the prompt tokenizer and chat template, the incremental detokenizer and stop-string
matching."""
