"""Deliberate breakages of the optional components (internal mTLS, inference pool), each applied to a fresh copy
and caught when only the overlay that uses the component is rendered and checked: the vendored CRD schemas
(cert-manager, Gateway API Inference Extension), references and the extension checks; breakages of the compose
mTLS file (deploy/compose.mtls.yml) caught by `docker compose config` and check_compose on the mTLS file sets.
(test_mutations.py runs the full check per breakage; these need only their overlay, which keeps them fast.)"""

from __future__ import annotations

import pytest

from tests.unit.deploy import deploy_checks as checks
from tests.unit.deploy import extension_checks
from tests.unit.deploy.deploy_copy import copy_deploy_files
from tests.unit.deploy.test_mutations import Mutation

MTLS = "deploy/k8s/components/internal-mtls/"
POOL = "deploy/k8s/components/inference-pool/"
OVERLAY = {MTLS: "gpu-mtls", POOL: "gpu-inference-pool"}

MUTATIONS = [
    Mutation("misspelled Certificate field (vendored cert-manager CRD schema)", MTLS + "certificates.yaml",
             "renewBefore: 720h", "renewbefore: 720h", "CRD schema"),
    Mutation("Issuer of an unknown kind (vendored cert-manager CRD schema)", MTLS + "certificates.yaml",
             "  selfSigned: {}", "  selfsigned: {}", "CRD schema"),
    Mutation("InferencePool target port as a bare number (vendored Inference Extension CRD schema)",
             POOL + "inference-pool.yaml", "    - number: 8000", "    - 8000", "CRD schema"),
    Mutation("gateway checks a name the scheduler certificate lacks", MTLS + "gateway-tls.yaml",
             "value: engine.pagedserve.svc", "value: engine", "does not carry"),
    Mutation("gateway without its client certificate", MTLS + "gateway-tls.yaml",
             "            - name: PAGEDSERVE_INTERNAL_TLS_CERT\n              value: /etc/pagedserve/tls/tls.crt\n"
             "            - name: PAGEDSERVE_INTERNAL_TLS_KEY\n              value: /etc/pagedserve/tls/tls.key\n",
             "", "presents no client certificate"),
    Mutation("worker preStop waits on the TLS port in plaintext", MTLS + "engine-tls.yaml",
             '"127.0.0.1:50052"', '"127.0.0.1:50051"', "in plaintext"),
    Mutation("TLS scheduler probed on its TLS port", MTLS + "engine-tls.yaml",
             "          readinessProbe:\n            grpc: {port: 50052}\n", "", "plaintext gRPC to the TLS port"),
    Mutation("TLS files from a Secret no Certificate makes", MTLS + "engine-tls.yaml",
             "secretName: engine-tls", "secretName: engine-cert", "nor a cert-manager Certificate"),
    Mutation("pool member's gateway routes over every replica", POOL + "engine-gateway.yaml",
             '"--scheduler-address", "127.0.0.1:50051"', '"--scheduler-address", "engine:50051"',
             "not its own pod's scheduler"),
    Mutation("endpoint picker reads a metric the scheduler does not expose", POOL + "epp.yaml",
             "kvUsageSpec: pagedserve_kv_cache_usage_perc", "kvUsageSpec: vllm:kv_cache_usage_perc",
             "no metric the scheduler exposes"),
    Mutation("endpoint picker scrapes the gateway's port", POOL + "epp.yaml",
             "          port: 8001\n", "          port: 8000\n", "the picker scrapes port 8000"),
    Mutation("pool pods labelled with an engine type the picker does not map", POOL + "engine-gateway.yaml",
             "llm-d.ai/engine-type: pagedserve", "llm-d.ai/engine-type: pagedserve-v2", "no engineConfigs entry"),
    Mutation("endpoint picker serving another pool", POOL + "epp.yaml",
             '"--pool-name", "pagedserve"', '"--pool-name", "default"', "serves pool 'default'"),
]


COMPOSE_MTLS = "deploy/compose.mtls.yml"
COMPOSE_MUTATIONS = [
    Mutation("compose worker serves plaintext", COMPOSE_MTLS, '      PAGEDSERVE_WORKER_TLS: "true"\n', "",
             "scheduler -> gpu-worker: not mutual TLS"),
    Mutation("compose scheduler probed on its TLS port", COMPOSE_MTLS, '"127.0.0.1:50052"', '"127.0.0.1:50051"',
             "compose scheduler: the health check must ask"),
    Mutation("compose scheduler certificate without client usage", COMPOSE_MTLS, '"scheduler:server+client"',
             '"scheduler:server"', "makes no client certificate for scheduler"),
    Mutation("compose gateway reads another service's certificate", COMPOSE_MTLS,
             "internal-tls-gateway:/etc/pagedserve/tls:ro", "internal-tls-scheduler:/etc/pagedserve/tls:ro",
             "must come read-only from the volume internal-tls-gateway"),
    Mutation("compose certificate volume mounted writable", COMPOSE_MTLS,
             "internal-tls-gpu-worker:/etc/pagedserve/tls:ro", "internal-tls-gpu-worker:/etc/pagedserve/tls",
             "read_only False"),
    Mutation("compose gateway checks the IPs it dials", COMPOSE_MTLS,
             "      PAGEDSERVE_INTERNAL_TLS_SERVER_NAME: scheduler\n", "", "so TLS checks an IP"),
    Mutation("compose gateway checks a name the scheduler certificate lacks", COMPOSE_MTLS,
             "PAGEDSERVE_INTERNAL_TLS_SERVER_NAME: scheduler", "PAGEDSERVE_INTERNAL_TLS_SERVER_NAME: engine",
             "checks the name 'engine'"),
    Mutation("compose worker starts before its certificate exists", COMPOSE_MTLS, "    depends_on: *after-certs\n",
             "", "compose gpu-worker: does not wait for internal-certs"),
]


@pytest.mark.parametrize("mutation", COMPOSE_MUTATIONS, ids=[m.name for m in COMPOSE_MUTATIONS])
def test_the_compose_checks_catch_the_breakage(mutation: Mutation, tmp_path):
    root = copy_deploy_files(tmp_path)
    mutation.apply(root)
    for variant in ("gpu-mtls", "cpu-mtls"):
        config, problems = checks.compose_config(root, variant)
        problems += checks.check_compose(config, variant) if config else []
        assert any(mutation.expected in problem for problem in problems), problems


def test_the_overlays_pass_unbroken(tmp_path):
    root = copy_deploy_files(tmp_path)
    for overlay in OVERLAY.values():
        assert _problems(root, overlay) == []


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_the_checks_catch_the_breakage(mutation: Mutation, tmp_path):
    root = copy_deploy_files(tmp_path)
    mutation.apply(root)
    problems = _problems(root, OVERLAY[mutation.path.rsplit("/", 1)[0] + "/"])
    assert any(mutation.expected in problem for problem in problems), problems


def _problems(root, overlay: str) -> list[str]:
    objects, problems = checks.render(root, overlay)
    if problems:
        return problems
    problems = checks.validate_schemas(root, {overlay: objects})
    problems += checks.check_references(objects) + checks.check_commands(objects) + checks.check_probes(objects)
    return problems + extension_checks.all_problems(objects)
