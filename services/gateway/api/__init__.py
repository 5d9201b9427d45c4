"""The OpenAI-compatible API: request models and their OpenAPI schema, sampling and structured-output fields turned
into engine parameters, the chat and completions endpoints, each choice's generation, and the response's forms
(JSON, SSE stream, usage, logprobs, the request's span)."""
