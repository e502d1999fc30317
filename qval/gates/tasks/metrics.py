"""Gate 4's table: per suite, the accuracy (or score) drop and the flip rate, and the config fields that limit them."""

from __future__ import annotations

from ...gate_metrics import NON_INFERIOR, GateMetrics, Metric

TASKS = GateMetrics("tasks", (  # per suite: drop@<suite>, flip_rate@<suite>
    Metric("drop", "margin", "max", "{what} on suite {suite}; " + NON_INFERIOR, on="hi"),
    Metric("flip_rate", "max_flip_rate", "max", "share of items of suite {suite} the two models mark differently; "
           "its exact 95% upper bound must stay within the limit", hi=1.0, on="hi"),
), verdict_only=("chance",), per="suites")
