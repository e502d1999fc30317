"""Gate 1's table: the figures it is judged on, one row each, and the config fields that limit them.

>>> AGREEMENT.fields
('min_top1', 'max_mean_kld', 'max_p99_kld')
"""

from __future__ import annotations

from ...gate_metrics import GateMetrics, Metric

AGREEMENT = GateMetrics("agreement", (
    Metric("top1", "min_top1", "min", "top-1 agreement with the reference (teacher-forced)", hi=1.0, sweep="top-1"),
    Metric("mean_kld", "max_mean_kld", "max", "mean KLD(ref‖cand) per scored token, nats", sweep="mean KLD"),
    Metric("p99_kld", "max_p99_kld", "max", "99th percentile of per-token KLD, nats", sweep="p99 KLD"),
))
