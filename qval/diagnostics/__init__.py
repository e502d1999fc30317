"""Per-layer scale diagnostics, sensitivity ranking and the automatic fallback search.

- `stats`: pure figures per quantizer (SQNR, clipped / flushed fractions, range use, outlier ratio)
- `scales`: one row per enabled quantizer of a calibrated candidate, and the written outlier rules
- `sensitivity`: the KLD each layer / projection type removes when kept in high precision
- `stage`: the cached `diagnose` and `sensitivity` stages of a run (layers.csv, report section)
- `command`: `qval diagnose` (calibrate, then those stages, no gates)
- `fallback`: `qval gate --fallback auto`, excluding the most sensitive layers until the gates pass
"""
