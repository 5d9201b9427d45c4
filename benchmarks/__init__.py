"""`pagedserve bench`: a streaming load generator and metrics reporter for OpenAI-compatible servers."""
