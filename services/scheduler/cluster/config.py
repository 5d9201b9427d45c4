"""Configuration of the pod deletion cost updater (cost_updater.py), part of the scheduler's config."""

from __future__ import annotations

from dataclasses import dataclass, field

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # token, ca.crt, namespace


@dataclass(frozen=True)
class PodDeletionCostConfig:
    pod_deletion_cost: bool = field(default=False, metadata={"help": (
        "keep this pod's controller.kubernetes.io/pod-deletion-cost annotation low when other replicas hold its "
        "cached blocks (needs --redis-url, a Kubernetes pod and a service account that may patch it), so that a "
        "Deployment's scale-down removes the most duplicated replica; also exports "
        "pagedserve_replica_duplicated_blocks_ratio")})
    pod_deletion_cost_interval_s: float = 20.0  # seconds between recomputations (a patch only when the cost changed)
    kubernetes_api_url: str = "https://kubernetes.default.svc"  # the Kubernetes API the annotation is patched through
    kubernetes_service_account_dir: str = field(default=SERVICE_ACCOUNT_DIR, metadata={"help": (
        "the service account's files: token, ca.crt (for an https API) and namespace, read at each patch (kubelet "
        "rotates the token)")})
    pod_name: str = ""  # this scheduler's pod (Kubernetes downward API, metadata.name); empty: the instance id
    pod_namespace: str = ""  # its namespace (metadata.namespace); empty: the service account's namespace file

    def __post_init__(self) -> None:
        if self.pod_deletion_cost_interval_s <= 0:
            raise ValueError("--pod-deletion-cost-interval-s must be positive, got "
                             f"{self.pod_deletion_cost_interval_s}")
