"""Gate 1 at depth: bucket bookkeeping by hand, and two planted candidates on the real model —
one identical to the reference up to position 600 and diverging after it (short-context gate 1
cannot see it; the depth gate rejects it and names the depth), one FP8-KV candidate whose KV
scales are damaged (rejected, while the same candidate with its calibrated scales passes)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from qval.config import parse_config
from qval.gates import GATES
from qval.gates.base import GateContext
from qval.gates.depth.judge import bucket_spans, divergence, first_beyond, summarize
from qval.verdict import decide

from ..conftest import ROOT, small_config
from .fakes import FakeEngine, FakeTokenizer, walk


def _cfg(**depth):
    data = small_config("depth-test", "none")
    data["gates"]["agreement"] = {**data["gates"]["agreement"], "tokens": 1024, "min_top1": 0.999, "max_mean_kld": 1e-4}
    data["gates"]["depth"] = {"dataset": str(ROOT / "calib_data/longctx_docs.jsonl"), "ctx": 1024, "tokens": 1024, "piece": 256,
                              "buckets": [256, 512, 768, 1024], "min_top1": 0.95, "max_mean_kld": 0.02, **depth}
    return parse_config(data, "<depth test>")


def test_buckets_cover_every_scored_position_once():
    spans = bucket_spans([512, 1024, 2048], 2047)
    assert spans == [(0, 512), (512, 1024), (1024, 2047)]
    assert sum(hi - lo for lo, hi in spans) == 2047
    assert bucket_spans([512, 4096], 1000) == [(0, 512), (512, 1000)]


def test_summary_figures_per_bucket_by_hand():
    """Two chunks of 8 positions; KLD 0 before depth 4 and 0.5 after, top-1 lost after depth 6."""
    cfg = _cfg(ctx=64, tokens=128, buckets=[4, 8], window=2)
    kld = np.zeros((2, 8))
    kld[:, 4:] = 0.5
    top1 = np.ones((2, 8), dtype=bool)
    top1[:, 6:] = False
    a = {"kld": kld, "top1": top1, "p_ref": np.full((2, 8), 0.5), "p_cand": np.full((2, 8), 0.4),
         "nll_ref": np.ones((2, 8)), "nll_cand": np.ones((2, 8))}
    r = summarize(cfg, a, {"dataset": "toy", "chunks": 2, "ctx": 64}, 0.0)
    m = r.measurements
    assert m["mean_kld@0-4"].value == 0.0 and m["mean_kld@4-8"].value == 0.5
    assert m["top1@0-4"].value == 1.0 and m["top1@4-8"].value == 0.5
    assert r.details.divergence.first_difference == 4
    assert first_beyond(r.details.divergence.series, 0.02, None) == 4
    assert first_beyond(r.details.divergence.series, None, 0.9) == 6
    # every limit applies to every bucket: the deep bucket fails, the shallow one passes
    v = decide({"depth": r}, GATES.get("depth").thresholds(cfg, r))
    outcome = {c.metric: c.outcome for c in v.checks}
    assert outcome == {"top1@0-4": "pass", "mean_kld@0-4": "pass", "top1@4-8": "fail", "mean_kld@4-8": "fail"}
    assert "first departs from the reference at depth 4" in v.checks[2].description


def test_identical_candidate_reproduces_at_every_depth():
    kld = np.zeros((1, 10))
    assert divergence(kld, kld == 0, 4)["first_difference"] is None


def test_fake_engines_diverging_after_a_depth(tmp_path):
    """The gate's run() end to end on the closed-form fake model: identical up to position 40."""
    from qval.gates.depth import run as depth_gate

    cfg = _cfg(ctx=128, tokens=128, piece=32, buckets=[32, 64, 128], max_mean_kld=0.01, min_top1=0.99)
    ref = FakeEngine(walk)
    cand = FakeEngine(lambda t, p: walk(t, p) if p < 40 else (walk(t, p) + 1) % 60)
    tok = FakeTokenizer()
    ctx = GateContext(cfg, ref, cand, tok, tmp_path)
    chunks = [[(7 * i) % 60 for i in range(128)]]
    orig = depth_gate.scored_chunks
    depth_gate.scored_chunks = lambda c: (chunks, {"dataset": "toy", "chunks": 1, "ctx": 128})
    try:
        r = depth_gate.run(ctx)
    finally:
        depth_gate.scored_chunks = orig
    assert r.status == "ok"
    assert r.details.divergence.first_difference == 40
    assert r.measurements["mean_kld@0-32"].value == 0.0
    assert r.measurements["top1@64-127"].value == 0.0
    assert (tmp_path / "positions.npz").is_file()


class _RopeBeyond:
    """A rotary embedding that compresses positions beyond `n` (p -> n + (p - n) // 2): the same
    model up to position n, a different positional encoding after it."""

    def __init__(self, rotary: torch.nn.Module, n: int) -> None:
        self.rotary, self.n = rotary, n
        self.forward = rotary.forward

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        moved = torch.where(position_ids >= self.n, self.n + (position_ids - self.n) // 2, position_ids)
        return self.forward(x, moved)


def diverging_after(model: torch.nn.Module, n: int) -> torch.nn.Module:
    m = copy.deepcopy(model)
    inner = m.model
    inner.rotary_emb.forward = _RopeBeyond(inner.rotary_emb, n)
    return m


@pytest.mark.slow
def test_candidate_diverging_past_600_is_rejected_at_depth_but_not_by_gate_1(default_model, tmp_path: Path):
    from qval.engines.hf import HFEngine

    cfg = _cfg()
    ref = HFEngine(default_model.model, default_model.tokenizer)
    cand = HFEngine(diverging_after(default_model.model, 600), default_model.tokenizer)
    ctx = GateContext(cfg, ref, cand, default_model.tokenizer, tmp_path)
    results = {}
    for name in ("agreement", "depth"):
        (tmp_path / name).mkdir()
        results[name] = GATES.get(name).run(GateContext(cfg, ref, cand, default_model.tokenizer, tmp_path / name))
    assert ctx.config is cfg
    short = decide({"agreement": results["agreement"]}, GATES.get("agreement").thresholds(cfg, results["agreement"]))
    assert short.approved and results["agreement"].measurements["mean_kld"].value == 0.0  # 512-token chunks never reach 600
    deep = decide({"depth": results["depth"]}, GATES.get("depth").thresholds(cfg, results["depth"]))
    assert not deep.approved
    failed = {c.metric for c in deep.failures}
    assert failed and all(not m.endswith(("@0-256", "@256-512")) for m in failed), failed
    assert results["depth"].details.divergence.first_difference == 601  # position 600 keeps its place; 601 is the first moved
    assert "first departs from the reference at depth 601" in deep.failures[0].description
    # the shallow buckets are exact
    assert results["depth"].measurements["mean_kld@0-256"].value == 0.0


@pytest.mark.slow
def test_fp8_kv_candidate_with_damaged_kv_scales_is_rejected(default_model, tmp_path: Path):
    """The same calibrated FP8-KV candidate passes with its own KV scales and is rejected once
    its key/value amax is cut to 5 % (the cache clips: missing or defaulted scales)."""
    from qval.engines import BUILDERS

    from ..engines.calibrated import build_context, calibrated_state, gate_config

    cfg = gate_config("depth-kv", "fp8", "fp8", gates={"depth": {
        "dataset": str(ROOT / "calib_data/longctx_docs.jsonl"), "ctx": 1024, "tokens": 1024, "piece": 256,
        "min_top1": 0.8, "max_mean_kld": 0.1}})
    state = calibrated_state(default_model, "fp8", "fp8")
    from qval.engines.hf import HFEngine

    ref = HFEngine(default_model.model, default_model.tokenizer)
    figures = {}
    for damaged in (False, True):
        cand = BUILDERS.get("fakequant")(build_context(default_model, cfg, state, tmp_path))
        if damaged:
            from qval.quantize.modelopt_adapter import iter_quantizers

            n = 0
            for name, q in iter_quantizers(cand.model):
                if name.endswith(("k_bmm_quantizer", "v_bmm_quantizer")) and q.is_enabled:
                    q.amax = q.amax * 0.05
                    n += 1
            assert n == 2 * default_model.model.config.num_hidden_layers
        folder = tmp_path / f"damaged{damaged}"
        folder.mkdir()
        r = GATES.get("depth").run(GateContext(cfg, ref, cand, default_model.tokenizer, folder))
        v = decide({"depth": r}, GATES.get("depth").thresholds(cfg, r))
        figures[damaged] = (v.approved, r.measurements["mean_kld"].value)
    assert figures[False][0], figures
    assert not figures[True][0], figures
    assert figures[True][1] > 3 * figures[False][1], figures
