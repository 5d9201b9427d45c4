"""A real Prometheus (Debian's) started with the shipped compose configuration loads every rule from
deploy/prometheus/rules and evaluates each without error; its scrape targets (compose's service names) do not
resolve here, so the target-down alert goes pending for both jobs. (tests/integration/test_prometheus_dashboard.py
evaluates every rule and every dashboard query against a live `pagedserve serve`.)"""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import yaml

from pagedserve.services.ports import free_port
from tests.conftest import REPO_ROOT
from tests.unit.deploy import alert_rules, deploy_tools


def _rules(url: str) -> list[dict]:
    """The rules as the API lists them; none while Prometheus is not up (no answer yet, or its plain-text 503 while
    the TSDB opens)."""
    try:
        response = httpx.get(url + "/api/v1/rules", timeout=2)
        reply = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return []
    if reply is None:
        return []
    return [rule for group in reply["data"]["groups"] for rule in group["rules"]]


def test_a_real_prometheus_loads_and_evaluates_every_rule(tmp_path):
    folder = shutil.copytree(REPO_ROOT / "deploy/prometheus", tmp_path / "prometheus")
    config = yaml.safe_load((folder / "prometheus.yml").read_text())
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    argv = [deploy_tools.prometheus(), f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address={url.removeprefix('http://')}"]
    with open(tmp_path / "prometheus.log", "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline, rules = time.monotonic() + 90, []
        while time.monotonic() < deadline:
            rules = _rules(url)
            evaluated = [r for r in rules if r.get("lastEvaluation", "").startswith("20")]
            pending = [a for r in rules if r["name"] == "PagedserveTargetDown" for a in r.get("alerts", [])]
            if rules and len(evaluated) == len(rules) and len(pending) == 2:
                break
            time.sleep(1)
        assert {r["name"] for r in rules} == {r.get("alert") or r.get("record")
                                              for r in alert_rules.rules(REPO_ROOT)}, (tmp_path / "prometheus.log")
        assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
        assert sorted(a["labels"]["job"] for a in pending) == ["pagedserve-gateway", "pagedserve-scheduler"]
        assert {a["state"] for a in pending} == {"pending"}
    finally:
        process.terminate()
        process.wait(30)
