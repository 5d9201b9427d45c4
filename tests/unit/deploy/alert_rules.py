"""The pagedserve Prometheus rules and their promtool unit tests: loading, running promtool, and the PromQL metric
names the rules read (every one must be a series the services expose, a recording rule or Prometheus' own `up`)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.unit.deploy import deploy_tools

RULES = Path("deploy/prometheus/rules/pagedserve.rules.yml")
RULE_TESTS = Path("deploy/prometheus/tests/pagedserve.rules.test.yml")
PROMETHEUS_OWN = {"up"}
_PROMQL_WORDS = {"sum", "by", "rate", "max", "and", "on", "or", "vector", "histogram_quantile", "increase",
                 "resets", "le", "bool"}


def rules(root: Path) -> list[dict]:
    return [rule for group in yaml.safe_load((root / RULES).read_text())["groups"] for rule in group["rules"]]


def alerts(root: Path) -> dict[str, dict]:
    return {rule["alert"]: rule for rule in rules(root) if "alert" in rule}


def promtool(root: Path, *args: str) -> list[str]:
    done = deploy_tools.run([deploy_tools.promtool(), *args], cwd=root)
    return [] if done.returncode == 0 else [f"promtool {' '.join(args)}: {(done.stdout + done.stderr).strip()[-1500:]}"]


def check_rules(root: Path) -> list[str]:
    return promtool(root, "check", "rules", str(RULES)) + promtool(root, "test", "rules", str(RULE_TESTS))


def series_read(expr: str) -> set[str]:
    """Metric names an expression reads (identifiers before a selector, range or operator; not functions)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_labels = re.sub(r"\{[^}]*\}", "", without_strings)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", without_ranges))
    grouping = set(re.findall(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", without_ranges))
    labels = {label.strip() for group in grouping for label in group.split(",")}
    return {n for n in names if n not in _PROMQL_WORDS | labels and not re.fullmatch(r"\d+[smhd]?|e", n)}


def unknown_series(root: Path, exposed: frozenset[str]) -> list[str]:
    recorded = {rule["record"] for rule in rules(root) if "record" in rule}
    problems = []
    for rule in rules(root):
        for name in sorted(series_read(rule["expr"]) - exposed - recorded - PROMETHEUS_OWN):
            problems.append(f"rule {rule.get('alert') or rule.get('record')} reads {name}, which no service exposes")
    return problems
