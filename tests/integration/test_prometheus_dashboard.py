"""A real Prometheus (Debian's) scrapes the running stack (`pagedserve serve` on the default model) with the
shipped prometheus.yml (targets pointed at this machine's ports) and its rules, and answers through its HTTP API:
every query of the shipped Grafana dashboard must return data; every recording and alert rule must evaluate
without error after the traffic, each recording rule must hold series, and every series an alert reads must
exist (on a healthy stack the alerts themselves stay silent: that they fire is promtool's unit tests' job,
deploy/prometheus/tests). `promtool check metrics` lints a real scrape of the scheduler and of the gateway."""

from __future__ import annotations

import datetime
import functools
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pagedserve.services.ports import free_port
from tests.integration.processes import REPO, wait_for
from tests.unit.deploy import alert_rules, deploy_checks, deploy_tools

SCRAPE_INTERVAL_S = 1  # and the rules' evaluation interval
RATE_WINDOW = "2m"  # stands in for Grafana's $__rate_interval; keeps the traffic in view while panels are polled


def _config(stack, folder: Path) -> Path:
    """The shipped prometheus.yml and rules with compose's service names replaced by this stack's ports."""
    shutil.copytree(REPO / "deploy/prometheus/rules", folder / "rules")
    path = folder / "prometheus.yml"
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    config["global"] |= {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"}
    assert config["rule_files"] == ["rules/*.yml"]  # read relative to the config file, as in compose
    local = {"scheduler:8001": f"127.0.0.1:{stack.scheduler_metrics_port}", "gateway:8000": f"127.0.0.1:{stack.port}"}
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            assert set(static["targets"]) <= set(local), static["targets"]
            static["targets"] = [local[t] for t in static["targets"]]
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def prometheus(stack, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    argv = [deploy_tools.prometheus(), f"--config.file={_config(stack, tmp_path)}",
            f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"]
    with open(tmp_path / "prometheus.log", "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 60, interval_s=0.5, what="Prometheus ready")
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, promql: str) -> list[dict]:
    reply = httpx.get(url + "/api/v1/query", params={"query": promql}, timeout=10).json()
    assert reply["status"] == "success", (promql, reply)
    return reply["data"]["result"]


def _finite(result: list[dict]) -> list[float]:
    return [float(r["value"][1]) for r in result if not math.isnan(float(r["value"][1]))]


@pytest.fixture(scope="module")
def traffic(prometheus, stack, model_name) -> float:
    """Two rounds of traffic, each scraped; the time the second ended (the rules must evaluate after it).
    Labelled series appear with their first observation, and rate() sees no increase from a series' first
    sample: so one round of traffic creates them and is scraped before the round the panels must show."""
    with httpx.Client(base_url=stack.base_url, timeout=120) as http:
        _traffic(http, model_name, "Warm-up")
        _wait_for_scrapes(prometheus, 1, "a scrape of both targets after the warm-up")
        _traffic(http, model_name, "Request")
        after_s = time.time()
        _wait_for_scrapes(prometheus, 2, "two scrapes of both targets after the traffic")
    return after_s


def test_every_dashboard_panel_returns_data_from_a_real_prometheus(prometheus, traffic, model_name):
    queries = deploy_checks.dashboard_queries(REPO)
    assert len(queries) >= 12
    for title, expr in queries:
        promql = expr.replace("$__rate_interval", RATE_WINDOW).replace("$model_name", model_name)
        # a scrape that times out on a loaded machine leaves a gap, so a rate may need a few more scrapes
        wait_for(functools.partial(_panel_data, prometheus, promql), 30, interval_s=0.5,
                 what=f"panel {title!r} returning finite data for {promql}")


def test_every_rule_evaluates_against_the_live_stack_and_reads_live_series(prometheus, traffic):
    shipped = alert_rules.rules(REPO)
    rules = wait_for(functools.partial(_rules_evaluated_after, prometheus, traffic, len(shipped)), 30,
                     interval_s=0.5, what="every rule evaluated after the traffic")
    assert {r["name"] for r in rules} == {r.get("alert") or r.get("record") for r in shipped}
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok" or r.get("lastError")] == []
    recorded = [r["record"] for r in shipped if "record" in r]
    for name in recorded:  # each is a ratio of this traffic: finite wherever its denominator saw requests
        wait_for(functools.partial(_panel_data, prometheus, name), 30, interval_s=0.5,
                 what=f"recording rule {name} holding finite series")
    for rule in shipped:
        assert query(prometheus, rule["expr"]) is not None  # success (asserted by query), firing or silent
        if "alert" not in rule:
            continue
        for series in sorted(alert_rules.series_read(rule["expr"])):
            assert query(prometheus, f"count({series})"), f"alert {rule['alert']} reads {series}, absent live"


def _rules_evaluated_after(url: str, after_s: float, expected: int) -> list[dict] | None:
    reply = httpx.get(url + "/api/v1/rules", timeout=10).json()
    rules = [rule for group in reply["data"]["groups"] for rule in group["rules"]]
    evaluated = [r for r in rules if _rfc3339_s(r.get("lastEvaluation", "")) > after_s]
    return rules if len(rules) == expected and len(evaluated) == expected else None


def _rfc3339_s(text: str) -> float:
    """Seconds since the epoch of Prometheus' lastEvaluation (RFC 3339, nanoseconds); 0 when never evaluated."""
    if not text.startswith("20"):
        return 0.0
    return datetime.datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", text)).timestamp()


def _traffic(http, model_name: str, label: str) -> None:
    """Streamed and whole completions of several tokens each: the kinds of traffic the panels show."""
    for i in range(6):
        body = {"model": model_name, "prompt": f"{label} {i}: once upon a time", "max_tokens": 6,
                "stream": i % 2 == 0}
        assert http.post("/v1/completions", json=body).status_code == 200


def _wait_for_scrapes(prometheus: str, scrapes: int, what: str) -> None:
    after_s = time.time()
    wait_for(lambda: all(float(r["value"][0]) > after_s + scrapes * SCRAPE_INTERVAL_S
                         for r in query(prometheus, "timestamp(up)")) and len(query(prometheus, "up == 1")) == 2,
             60, interval_s=0.5, what=what)


def _panel_data(url: str, promql: str) -> list[dict] | None:
    result = query(url, promql)
    return result if result and _finite(result) else None


def test_promtool_accepts_real_scrapes(stack, http):
    http.get("/v1/models")
    for url in (stack.scheduler_metrics_url, stack.base_url + "/metrics"):
        scrape = httpx.get(url, timeout=10).text
        done = deploy_tools.run([deploy_tools.promtool(), "check", "metrics"], stdin=scrape)
        assert done.returncode == 0, f"{url}: {done.stdout}{done.stderr}"
