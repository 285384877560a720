"""Reading /metrics and the dashboard and alert rules under docs/grafana, for tests/test_metrics*.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "taskhub.json"
RULES = ROOT / "docs" / "grafana" / "alert-rules.yml"


def parse(text: str) -> dict[str, dict[tuple, float]]:
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples, sample: str, /, **labels) -> float | None:
    return samples.get(sample, {}).get(tuple(sorted(labels.items())))


METRIC_NAME = re.compile(r"\btaskhub_[a-z_]+\b")
SUFFIXES = ("_bucket", "_count", "_sum")


def family_of(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def rule_expressions() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def used_metrics() -> set[str]:
    """The metric families named by the dashboard's and the alert rules' expressions."""
    expressions = dashboard_expressions() + rule_expressions()
    return {family_of(name) for expression in expressions for name in METRIC_NAME.findall(expression)}
