"""Structured outputs and tool calls: request constraints (JSON schema, regex, grammar), each grammar vetted in a
child process before a request carries it, tool definitions turned into constraints, and tool calls parsed out of
the generated text (whole or streamed)."""
