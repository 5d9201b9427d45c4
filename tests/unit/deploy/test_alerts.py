"""The Prometheus rules: promtool accepts them and their unit tests pass; each alert has a case that fires and one
that stays silent, and each test is able to fail (an alert that never fires, or always fires, breaks it); the rules
read only series the services expose; compose's Prometheus and the Operator's PrometheusRule load the same rules;
every alert has a runbook line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.unit.deploy import alert_rules
from tests.unit.deploy import deploy_checks as checks

ALERTS = sorted(alert_rules.alerts(REPO_ROOT))


def test_promtool_checks_the_rules_and_their_unit_tests_pass():
    assert len(ALERTS) >= 15
    assert alert_rules.check_rules(REPO_ROOT) == []


def test_each_alert_has_a_case_that_fires_and_one_that_stays_silent():
    cases = [case for test in yaml.safe_load((REPO_ROOT / alert_rules.RULE_TESTS).read_text())["tests"]
             for case in test.get("alert_rule_test", [])]
    for alert in ALERTS:
        mine = [case for case in cases if case["alertname"] == alert]
        assert any(case["exp_alerts"] for case in mine), f"{alert}: no case where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{alert}: no case where it stays silent"


@pytest.mark.parametrize("replacement", ["vector(1)", "vector(0) > 1"], ids=["always", "never"])
@pytest.mark.parametrize("alert", ALERTS)
def test_the_unit_tests_fail_when_an_alert_always_or_never_fires(alert, replacement, tmp_path):
    shutil.copytree(REPO_ROOT / "deploy/prometheus", tmp_path / "deploy/prometheus")
    path = tmp_path / alert_rules.RULES
    document = yaml.safe_load(path.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = replacement
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    problems = alert_rules.promtool(tmp_path, "test", "rules", str(alert_rules.RULE_TESTS))
    assert problems and f"alertname: {alert}," in problems[0]


def test_the_rules_read_only_series_the_services_expose():
    assert alert_rules.unknown_series(REPO_ROOT, checks.metric_names()) == []


def test_the_check_finds_a_misspelled_series():
    assert alert_rules.series_read('max by (instance) (pagedserve_kv_cache_usage_ratio{x="y"}[5m]) > 0.9') == {
        "pagedserve_kv_cache_usage_ratio"}


def test_compose_prometheus_loads_the_rules():
    config = yaml.safe_load((REPO_ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert config["rule_files"] == ["rules/*.yml"]
    compose, problems = checks.compose_config(REPO_ROOT, "gpu")
    assert problems == []
    mounts = {m["target"]: Path(m["source"]) for m in compose["services"]["prometheus"]["volumes"]}
    assert mounts["/etc/prometheus/rules"] == REPO_ROOT / alert_rules.RULES.parent
    assert mounts["/etc/prometheus/prometheus.yml"].parent / "rules" == mounts["/etc/prometheus/rules"]


def test_the_operator_prometheus_rule_holds_the_same_groups():
    done = subprocess.run([sys.executable, "deploy/scripts/prometheus_rule.py", "--check"], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rule = yaml.safe_load((REPO_ROOT / "deploy/k8s/components/monitoring/prometheus-rule.yaml").read_text())
    assert rule["spec"]["groups"] == yaml.safe_load((REPO_ROOT / alert_rules.RULES).read_text())["groups"]


def test_every_alert_has_a_runbook_line():
    operations = (REPO_ROOT / "docs/operations.md").read_text()
    section = operations.split("## Alerts", 1)[1].split("\n## ", 1)[0]
    for alert in ALERTS:
        assert f"`{alert}`" in section, f"{alert} has no runbook line in docs/operations.md#alerts"
