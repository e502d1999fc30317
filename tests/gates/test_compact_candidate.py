"""Every gate with a candidate known only by its top K (what a served engine answers): the reference
itself answered as a server answers passes the identity's exact limits — top-1 1, KLD 0, PPL ratio 1,
no flip — through gate 1, depth, gates 2 and 3, retrieval and the task suites, with the snapshot's
compact reference on the other side."""

from __future__ import annotations

import pytest

from ..engines.topk_engine import TopKEngine
from .test_gates_e2e import exact_gates, gate


@pytest.mark.slow
def test_a_top_k_candidate_passes_the_identity_limits_through_every_gate(tmp_path, patch_reference, monkeypatch):
    from qval.engines import BUILDERS

    real = BUILDERS.get("fakequant")
    monkeypatch.setitem(BUILDERS._items, "fakequant", lambda ctx: TopKEngine(real(ctx), 16))
    data = exact_gates(tmp_path, "topk-identity")
    data["gates"]["tasks"] = {"suites": [{"builtin": "choice", "size": 12, "margin": 0.2, "max_flip_rate": 0.3},
                                         {"builtin": "cloze", "size": 12, "margin": 0.2, "max_flip_rate": 0.3}]}
    code, report, out = gate(tmp_path, data)
    assert code == 0, out
    assert {c["gate"] for c in report["verdict"]["checks"]} == {"agreement", "quality", "longgen", "depth", "retrieval", "tasks"}
    assert report["candidate"]["engine"]["backend"] == "topk"
    a = report["gates"]["agreement"]
    assert a["measurements"]["top1"]["value"] == 1.0 and a["measurements"]["mean_kld"]["value"] == 0.0
    assert a["details"]["kld_topk"]["mean_kld_lower"] == 0.0 and 0 < a["details"]["kld_topk"]["mean_unseen_mass"] < 1
    assert a["details"]["kld_topk"]["mean_kld_estimate"] == 0.0  # the plain estimate beside the gated figure
    assert report["gates"]["quality"]["measurements"]["ppl_ratio"]["value"] == 1.0
    md = (tmp_path / "reports/topk-identity/report.md").read_text()
    assert "known by its top K log-probabilities" in md and "strict lower bound" in md and "the plain estimate" in md
