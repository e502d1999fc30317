"""Gate 1 at depth's table: the figures of each depth bucket and the config fields that limit them.

>>> DEPTH.by_field("max_mean_kld").describe(where="at context depths 0–512")
'mean KLD(ref‖cand) at context depths 0–512, nats'
"""

from __future__ import annotations

from ...gate_metrics import GateMetrics, Metric

DEPTH = GateMetrics("depth", (  # every limit applies to every depth bucket: `{metric}@{bucket}`
    Metric("top1", "min_top1", "min", "top-1 agreement {where} (teacher-forced)", hi=1.0),
    Metric("mean_kld", "max_mean_kld", "max", "mean KLD(ref‖cand) {where}, nats", sweep="depth mean KLD"),
    Metric("p99_kld", "max_p99_kld", "max", "99th percentile of per-token KLD {where}, nats"),
))
