"""The retrieval matrix's table: its accuracy drops and answer KLD, and the config fields that limit them.

>>> sorted(RETRIEVAL.cache_exclude())
['enabled', 'margin', 'margin_overall', 'max_answer_kld', 'min_reference_accuracy']
"""

from __future__ import annotations

from ...gate_metrics import NON_INFERIOR, GateMetrics, Metric

RETRIEVAL = GateMetrics("retrieval", (
    Metric("drop", "margin", "max", "retrieval accuracy drop (reference − candidate) {where}; " + NON_INFERIOR,
           hi=1.0, on="hi"),  # per context length: drop@<length>
    Metric("drop", "margin_overall", "max", "retrieval accuracy drop (reference − candidate) {where}; " + NON_INFERIOR,
           hi=1.0, on="hi", sweep="retrieval drop"),
    Metric("answer_kld", "max_answer_kld", "max",
           "mean KLD(ref‖cand) on the pass-code tokens (teacher-forced on the true code), nats", on="hi"),
), verdict_only=("min_reference_accuracy",))
