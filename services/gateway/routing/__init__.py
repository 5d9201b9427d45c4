"""Which scheduler replica serves a request: the replica set and its health, each replica's gRPC client, the routing
policies, the router that applies them, the Redis mirror of the replicas' prefix caches, and the router's metrics."""
