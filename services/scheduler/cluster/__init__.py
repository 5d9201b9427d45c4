"""The scheduler's part in a cluster's scale-down: it keeps its own pod's `controller.kubernetes.io/pod-deletion-cost`
equal to how little of its prefix cache other replicas hold, so that a ReplicaSet scale-down removes the replica
whose cached blocks are most duplicated elsewhere. Off by default (`--pod-deletion-cost`); a background task of the
scheduler process, never on the engine step's path."""
