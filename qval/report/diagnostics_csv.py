"""layers.csv: the per-quantizer scale diagnostics (`qval.diagnostics.scales`' rows) as a table, one row per
quantizer; report.md and report.html point to it."""

from __future__ import annotations

import csv
import io
from typing import Any

#: columns of layers.csv, in order (keys of a scales row)
COLUMNS = ("quantizer", "unit", "part", "kind", "format", "granularity", "groups", "numel", "amax_max", "amax_mean",
           "maxbound", "scale_max", "scale_mean", "sqnr_db", "clipped", "flushed", "range_use", "outlier_ratio",
           "p99_9_abs", "max_abs", "pqs_min", "pqs_max", "pqs_mean", "pqs_spread", "flags")


def layers_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: _csv_value(r.get(k)) for k in COLUMNS})
    return buf.getvalue()


def _csv_value(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v
