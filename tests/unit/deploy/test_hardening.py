"""The rendered overlays meet the hardening checks (hardening_checks.py); the model is named in one place."""

from __future__ import annotations

import pytest

from tests.unit.deploy import deploy_checks as checks
from tests.unit.deploy import hardening_checks as hardening
from tests.unit.deploy.deploy_copy import copy_deploy_files


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    root = copy_deploy_files(tmp_path_factory.mktemp("deploy"))
    objects = {}
    for overlay in checks.OVERLAYS:
        objects[overlay], problems = checks.render(root, overlay)
        assert problems == []
    return objects


@pytest.mark.parametrize("overlay", checks.OVERLAYS)
def test_hardening(rendered, overlay):
    assert hardening.all_problems(rendered[overlay], overlay) == []


def _engine(objects: list[dict]) -> dict:
    (engine,) = [o for o in objects if o["kind"] in ("StatefulSet", "Deployment") and o["metadata"]["name"] == "engine"]
    return engine


def test_engines_are_autoscaled_only_with_a_component(rendered):
    assert _engine(rendered["gpu"])["kind"] == "StatefulSet"
    assert ("StatefulSet", "engine") not in hardening.scaled_targets(rendered["gpu"])
    for overlay in ("gpu-keda", "gpu-hpa"):
        assert ("Deployment", "engine") in hardening.scaled_targets(rendered[overlay])
        assert "replicas" not in _engine(rendered[overlay])["spec"]


def test_the_checks_see_a_replica_count_beside_an_autoscaler(rendered):
    objects = [dict(o, spec={**o["spec"], "replicas": 2}) if o is _engine(rendered["gpu-keda"]) else o
               for o in rendered["gpu-keda"]]
    assert any("sets replicas although ScaledObject" in p for p in hardening.check_autoscaled_replicas(objects))


def test_the_checks_see_an_egress_hole(rendered):
    objects = [o for o in rendered["gpu"] if o["metadata"]["name"] != "engine-egress"]
    assert "egress from engine to redis:6379 is not allowed" in hardening.check_egress(objects)


def _with_model(tmp_path, source: str, name: str) -> list[dict]:
    root = copy_deploy_files(tmp_path)
    kustomization = root / "deploy/k8s/base/kustomization.yaml"
    text = kustomization.read_text()
    assert text.count("source=default") == 1 and text.count("name=SmolLM2-135M-Instruct") == 1
    kustomization.write_text(text.replace("source=default", f"source={source}")
                             .replace("name=SmolLM2-135M-Instruct", f"name={name}"))
    objects, problems = checks.render(root, "gpu")
    assert problems == []
    return objects


def test_the_model_is_named_in_one_place_and_every_reference_follows(tmp_path):
    objects = _with_model(tmp_path, "hf://meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct")
    assert "SmolLM2" not in str(objects)
    assert checks.check_commands(objects) == [] and checks.check_references(objects) == []
    config_maps = checks.by_kind(objects, "ConfigMap")
    fetched, served = [], []
    for pod in checks.pods(objects):
        for container in pod.containers():
            command = checks.container_command(container, config_maps)
            env = checks.literal_env(container, config_maps)
            if command[:2] == checks.FETCH_MODEL:
                fetched.append((pod.name, command[2], command[3]))
            if checks.service_module(container) in ("pagedserve.services.gpu_worker", "pagedserve.services.gateway"):
                config = checks.service_config(command, env)
                served.append((pod.name, config.worker.model_dir if hasattr(config, "worker") else config.model_dir))
    assert sorted(fetched) == [("engine", "hf://meta-llama/Llama-3.1-8B-Instruct", "/models/Llama-3.1-8B-Instruct"),
                               ("gateway", "hf://meta-llama/Llama-3.1-8B-Instruct", "/models/Llama-3.1-8B-Instruct")]
    assert sorted(served) == [("engine", "/models/Llama-3.1-8B-Instruct"),
                              ("gateway", "/models/Llama-3.1-8B-Instruct")]


def test_engines_download_into_their_own_volume(rendered):
    (engine,) = [o for o in rendered["gpu"] if o["kind"] == "StatefulSet"]
    (claim,) = engine["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "PersistentVolumeClaim" not in {o["kind"] for o in rendered["gpu"]}  # no shared RWX claim left
    worker = next(c for c in engine["spec"]["template"]["spec"]["containers"] if c["name"] == "gpu-worker")
    startup = worker["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60  # an 8B model's load, in minutes
