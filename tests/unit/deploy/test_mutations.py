"""Deliberate breakages of the deploy files, each applied to a fresh copy: the full check (the real tools and our
cross-references, as test_deploy.py runs them) must report each one, with a message naming what broke."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.deploy import deploy_checks as checks
from tests.unit.deploy.deploy_copy import copy_deploy_files

K8S = "deploy/k8s/base/"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    expected: str  # a piece of the problem the checks must report

    def apply(self, root: Path) -> None:
        """Break the copy of the deploy files under `root` (asserting the text to break is still there)."""
        path = root / self.path
        text = path.read_text()
        assert self.old in text, f"the mutation no longer applies to {self.path}"
        path.write_text(text.replace(self.old, self.new, 1))


MUTATIONS = [
    Mutation("probe on a port the container does not serve", K8S + "gateway.yaml",
             "httpGet: {path: /health, port: http}", "httpGet: {path: /health, port: 8080}", "probes port 8080"),
    Mutation("probe on a path the gateway does not serve", K8S + "gateway.yaml",
             "httpGet: {path: /health, port: http}", "httpGet: {path: /healthz, port: http}", "does not serve"),
    Mutation("dangling ConfigMap reference", K8S + "gateway.yaml",
             "configMapRef: {name: pagedserve-env}", "configMapRef: {name: pagedserve-config}", "missing ConfigMap"),
    Mutation("GPU reservation emptied", "deploy/k8s/overlays/gpu/kustomization.yaml",
             'limits: {cpu: "8", memory: 32Gi, nvidia.com/gpu: 1}', 'limits: {cpu: "8", memory: 32Gi}',
             "reserves no nvidia.com/gpu"),
    Mutation("USER removed from the Dockerfile", "deploy/docker/Dockerfile", "USER 10001:10001\n", "", "no USER"),
    Mutation("bad storage size", K8S + "engine.yaml", "storage: 40Gi", "storage: 40GB", "is not a quantity"),
    Mutation("scheduler liveness follows its worker's readiness", K8S + "engine.yaml",
             "livenessProbe:\n            grpc: {port: 50051}",
             "livenessProbe:\n            grpc: {port: 50051, service: pagedserve.v1.SchedulerService}",
             "liveness must not follow"),
    Mutation("worker without a startup probe", K8S + "engine.yaml",
             "          startupProbe:  # the model is loaded: 120 x 10 s = 20 minutes, sized for an 8B model (header)\n"
             "            grpc: {port: 50061, service: pagedserve.v1.WorkerService}\n            periodSeconds: 10\n"
             "            timeoutSeconds: 5\n            failureThreshold: 120\n",
             "", "no startupProbe"),
    Mutation("latest image tag", "deploy/k8s/overlays/gpu/kustomization.yaml", "newTag: 0.1.0", "newTag: latest",
             "is not pinned"),
    Mutation("pod may run as root", K8S + "engine.yaml", "runAsNonRoot: true", "runAsNonRoot: false",
             "runAsNonRoot"),
    Mutation("writable root filesystem", K8S + "gateway.yaml", "readOnlyRootFilesystem: true",
             "readOnlyRootFilesystem: false", "readOnlyRootFilesystem must be true"),
    Mutation("BestEffort gateway (no requests)", K8S + "gateway.yaml", "requests: {cpu: 500m, memory: 1Gi}\n", "",
             "no cpu in resources.requests"),
    Mutation("network policy opens the worker to gateways", K8S + "network-policies.yaml",
             "component: gateway\n      ports:\n        - port: 50051",
             "component: gateway\n      ports:\n        - port: 50061", "worker port 50061"),
    Mutation("grace period shorter than the drain", K8S + "engine.yaml", "terminationGracePeriodSeconds: 90",
             "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds 30"),
    Mutation("secret key that does not exist", K8S + "gateway.yaml", "key: api-key", "key: apikey",
             "which does not exist"),
    Mutation("Service sends traffic to a port nobody serves", K8S + "gateway.yaml",
             "port: 8000\n      targetPort: http", "port: 8000\n      targetPort: 8080", "which no container serves"),
    Mutation("compose publishes the API on every interface", "docker-compose.yml",
             '"${PAGEDSERVE_BIND_ADDRESS:-127.0.0.1}:8000:8000"', '"8000:8000"', "not 127.0.0.1"),
    Mutation("Prometheus scrapes the wrong scheduler port", "deploy/prometheus/prometheus.yml", "scheduler:8001",
             "scheduler:8000", "prometheus.yml scrapes"),
    Mutation("dashboard reads a metric nobody exposes", "deploy/grafana/dashboards/pagedserve.json",
             "pagedserve_kv_cache_usage_perc", "pagedserve_kv_cache_usage_ratio", "no service exposes"),
    Mutation("traces sent to a collector the manifests do not ship", K8S + "config.yaml",
             "http://otel-collector:4317", "http://otel:4317", "is not a Service port"),
    Mutation("misspelled field (schema)", K8S + "redis.yaml", "livenessProbe:", "livenesProbe:", "kubernetes-validate"),
    Mutation("scheduler pointed at another worker port", K8S + "engine.yaml", '"127.0.0.1:50061"',
             '"127.0.0.1:50062"', "is not its pod's worker"),
    Mutation("engines behind a ClusterIP Service (gateways would see one replica)", K8S + "engine.yaml",
             "  clusterIP: None\n", "", "not headless"),
    Mutation("Redis closed to the gateways' routers", K8S + "network-policies.yaml",
             "        - podSelector:\n            matchLabels:\n              app.kubernetes.io/name: pagedserve\n"
             "              app.kubernetes.io/component: gateway\n      ports:\n        - port: 6379",
             "      ports:\n        - port: 6379", "not engines and gateways"),
    Mutation("prefix routing without the engines' indexes", K8S + "gateway.yaml",
             ',\n                    "--redis-url", "redis://redis:6379/0"]', "]", "routes by hashing only"),
    Mutation("Dockerfile on an unpinned base image", "deploy/docker/Dockerfile",
             "ARG BASE_IMAGE=python:3.11.11-slim-bookworm", "ARG BASE_IMAGE=python:latest", "hadolint"),
    Mutation("misspelled ScaledObject field (vendored KEDA CRD schema)",
             "deploy/k8s/components/autoscaling-keda/scaled-object.yaml", "pollingInterval: 15",
             "pollInterval: 15", "CRD schema"),
    Mutation("probe left with the 1 s default timeout", K8S + "redis.yaml",
             "            periodSeconds: 20\n            timeoutSeconds: 5\n", "            periodSeconds: 20\n",
             "has no timeoutSeconds"),
    Mutation("GPU overlay without the nvidia RuntimeClass", "deploy/k8s/overlays/gpu/kustomization.yaml",
             "            runtimeClassName: nvidia\n", "", "runtimeClassName"),
    Mutation("engine worker Burstable (limit above request)", "deploy/k8s/overlays/gpu/kustomization.yaml",
             'limits: {cpu: "8", memory: 32Gi,', 'limits: {cpu: "8", memory: 48Gi,', "not Guaranteed QoS"),
    Mutation("tensor-parallel pod with fewer GPUs than ranks", "deploy/k8s/overlays/gpu-tp/kustomization.yaml",
             "          - spec.template.spec.containers.[name=gpu-worker].resources.limits.[nvidia.com/gpu]\n", "",
             "resources.limits nvidia.com/gpu 1 for --tensor-parallel-size 4"),
    Mutation("compose Grafana with its login form", "docker-compose.yml", 'GF_AUTH_DISABLE_LOGIN_FORM: "true"',
             'GF_AUTH_DISABLE_LOGIN_FORM: "false"', "login form"),
]


def test_the_issue_asks_for_at_least_fifteen_distinct_breakages():
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS) >= 15


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_the_checks_catch_the_breakage(mutation: Mutation, tmp_path):
    root = copy_deploy_files(tmp_path)
    mutation.apply(root)
    problems = checks.all_problems(root)
    assert any(mutation.expected in problem for problem in problems), problems
