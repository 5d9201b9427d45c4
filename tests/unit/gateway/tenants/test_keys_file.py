"""The keys file: the issue's JSON shape and its YAML twin load, keys are held only as digests, bad files are
refused without quoting a key, and the registry reloads a changed file."""

from __future__ import annotations

import json
import logging
import os

import pytest

from pagedserve.services.gateway.tenants.keys_file import (
    DEFAULT_TENANT,
    KeysFileError,
    Tenant,
    key_digest,
    load_keys_file,
)
from pagedserve.services.gateway.tenants.registry import TenantRegistry

ISSUE_SHAPE = {"tenants": {"team-a": {"keys": ["sk-a1"], "rpm": 60, "tpm": 100000, "max_concurrent": 8,
                                      "priority": 0, "weight": 1}}}


def test_the_issues_json_shape_and_yaml_load_the_same(tmp_path):
    json_path = tmp_path / "keys.json"
    json_path.write_text(json.dumps(ISSUE_SHAPE))
    yaml_path = tmp_path / "keys.yaml"
    yaml_path.write_text("tenants:\n  team-a:\n    keys: [sk-a1]\n    rpm: 60\n    tpm: 100000\n"
                         "    max_concurrent: 8\n    priority: 0\n    weight: 1\n")
    from_json, from_yaml = load_keys_file(json_path), load_keys_file(yaml_path)
    expected = Tenant("team-a", rpm=60, tpm=100000, max_concurrent=8, priority=0, weight=1.0)
    assert from_json.tenants == from_yaml.tenants == (expected,)
    assert from_json.lookup(b"sk-a1") == expected and from_json.lookup(b"sk-a2") is None
    assert "sk-a1" not in repr(from_json) and key_digest("sk-a1") in from_json.by_digest


def test_every_limit_is_optional_and_models_and_max_tokens_load(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text("tenants:\n  bare: {keys: [k1]}\n  narrow: {keys: [k2, k3], models: [m1], max_tokens: 64,"
                    " kv_cache_share: 0.25}\n")
    table = load_keys_file(path)
    assert table.tenants == (Tenant("bare"), Tenant("narrow", max_tokens=64, models=("m1",), kv_cache_share=0.25))
    assert table.lookup(b"k3").name == "narrow"


@pytest.mark.parametrize("body, fault", [
    ({"tenants": {"a": {"keys": ["sk-secret-1"], "rpm": -1}}}, "'rpm' must be positive"),
    ({"tenants": {"a": {"keys": ["sk-secret-1"], "rpm": "60"}}}, "'rpm' must be a number"),
    ({"tenants": {"a": {"keys": ["sk-secret-1"], "rps": 1}}}, "unknown field"),
    ({"tenants": {"a": {"keys": ["sk-secret-1"], "kv_cache_share": 1.5}}}, "'kv_cache_share' is a fraction"),
    ({"tenants": {"a": {"keys": ["sk-secret-1"], "kv_cache_share": 0}}}, "'kv_cache_share' must be positive"),
    ({"tenants": {"a": {"keys": []}}}, "non-empty list"),
    ({"tenants": {"a": {"keys": ["sk-secret-1"]}, "b": {"keys": ["sk-secret-1"]}}}, "another tenant"),
    ({"tenants": {"a b{}": {"keys": ["sk-secret-1"]}}}, "tenant name"),
    ({"tenants": {DEFAULT_TENANT: {"keys": ["sk-secret-1"]}}}, "tenant name"),
    ({"keys": ["sk-secret-1"]}, "'tenants' mapping"),
])
def test_a_bad_file_is_refused_naming_the_fault_never_the_key(tmp_path, body, fault):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(body))
    with pytest.raises(KeysFileError, match=fault) as caught:
        load_keys_file(path)
    assert "sk-secret-1" not in str(caught.value)


def test_priority_is_clamped_to_the_tenants_class():
    tenant = Tenant("t", priority=5)
    assert [tenant.clamp_priority(p) for p in (None, 0, 5, 9)] == [5, 5, 5, 9]


def test_the_registry_reloads_a_changed_file_and_keeps_the_old_one_on_a_bad_change(tmp_path, caplog):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"tenants": {"a": {"keys": ["sk-old"]}}}))
    registry = TenantRegistry(str(path), api_key="sk-single")
    assert registry.authenticate(b"Bearer sk-old").name == "a"
    assert registry.authenticate(b"Bearer sk-single").name == DEFAULT_TENANT  # --api-key is one more tenant
    assert registry.authenticate(b"Bearer sk-new") is None and registry.authenticate(b"sk-old") is None
    assert not registry.reload_if_changed()  # unchanged

    path.write_text(json.dumps({"tenants": {"a": {"keys": ["sk-new"]}, "b": {"keys": ["sk-b"]}}}))
    os.utime(path, ns=(1, 10**18))  # a new mtime even on a coarse filesystem clock
    assert registry.reload_if_changed()
    assert registry.authenticate(b"Bearer sk-new").name == "a" and registry.authenticate(b"Bearer sk-old") is None
    assert registry.tenant_names == ("a", "b", DEFAULT_TENANT)

    path.write_text("tenants: {a: {keys: sk-broken-secret}}")
    os.utime(path, ns=(1, 2 * 10**18))
    with caplog.at_level(logging.INFO):
        assert not registry.reload_if_changed()
    assert registry.authenticate(b"Bearer sk-new").name == "a"  # the previous table stays in force
    assert "not reloaded" in caplog.text and "sk-broken-secret" not in caplog.text and "sk-new" not in caplog.text


def test_without_keys_every_request_is_the_open_default_tenant():
    registry = TenantRegistry()
    assert not registry.auth_required
    assert registry.authenticate(b"").name == DEFAULT_TENANT and registry.tenant_names == (DEFAULT_TENANT,)


def test_the_kubernetes_secret_example_holds_a_valid_keys_file(tmp_path):
    import yaml

    secret = yaml.safe_load(open("deploy/k8s/examples/api-keys-secret.yaml"))
    path = tmp_path / "keys.yaml"
    path.write_text(secret["stringData"]["keys.yaml"])
    assert [t.name for t in load_keys_file(path).tenants] == ["team-a", "batch-jobs"]

