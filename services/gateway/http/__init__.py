"""HTTP concerns that hold for every endpoint: admission and drain, body-size limit, CORS, OpenAI-style errors
(the one place gRPC errors become HTTP statuses) and the gateway's own Prometheus series."""
