"""The pod deletion cost of a replica: lowest for the replica whose cached blocks other replicas hold most.

Contract: cost = round(COST_SCALE x (1 - duplicated_ratio)), an integer in [0, COST_SCALE]; a higher duplicated
ratio never gives a higher cost, and an empty cache (ratio 1.0) costs 0. A ReplicaSet scaling down deletes the
pods of lowest `controller.kubernetes.io/pod-deletion-cost` first (among pods equally ready). COST_SCALE is the
resolution: ratios closer than 1/COST_SCALE share a cost, so the annotation (one pod update on the API server)
changes only when the ratio moves by at least that much (the Kubernetes docs ask not to update it often).
"""

from __future__ import annotations

from pagedserve.shared.block_overlap import Overlap

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
COST_SCALE = 1000


def deletion_cost(overlap: Overlap) -> int:
    return round(COST_SCALE * (1.0 - overlap.duplicated_ratio))
