"""Scale diagnostics on real ModelOpt quantizers (a toy model calibrated by qval's adapter)."""

from __future__ import annotations

import csv
import fnmatch
import io

import pytest
import torch

from qval.config import parse_config
from qval.diagnostics import scales
from qval.diagnostics.stage import effective_bits, kept_high, layers_csv, weight_budget
from qval.diagnostics.stats import tensor_sqnr_db
from qval.quantize.modelopt_adapter import iter_quantizers

from . import toy


@pytest.fixture(scope="module")
def int8_sq():
    return toy.quantized("int8_sq")


def rows_of(model, data):
    with torch.no_grad():
        rows = scales.collect(model, iter_quantizers(model), data, "cpu")
    return {r["quantizer"]: r for r in rows}


def test_rows_cover_every_enabled_quantizer(int8_sq):
    _, cand, data = int8_sq
    rows = rows_of(cand, data)
    enabled = {n for n, q in iter_quantizers(cand) if q.is_enabled}
    assert set(rows) == enabled and len(enabled) == toy.LAYERS * 2 * 2  # up/down × weight/input; lm_head excluded
    w = rows["model.layers.1.mlp.down_proj.weight_quantizer"]
    assert (w["unit"], w["part"], w["kind"]) == ("model.layers.1", "mlp.down_proj", "weight")
    assert (w["format"], w["granularity"], w["maxbound"], w["groups"]) == ("INT8", "per-channel axis 0", 127.0, toy.DIM)
    assert w["scale_max"] == pytest.approx(w["amax_max"] / 127)
    i = rows["model.layers.1.mlp.up_proj.input_quantizer"]
    assert (i["kind"], i["granularity"], i["groups"]) == ("input", "per-tensor", 1)
    assert i["pqs_spread"] > 1 and i["pqs_min"] > 0  # SmoothQuant put a smoothing factor per channel


def test_weight_sqnr_is_the_quantizers_own(int8_sq):
    _, cand, data = int8_sq
    rows = rows_of(cand, data)
    lin = cand.model.layers[2].mlp.up_proj
    with torch.no_grad():
        expected = tensor_sqnr_db(lin.weight, lin.weight_quantizer(lin.weight))
    got = rows["model.layers.2.mlp.up_proj.weight_quantizer"]
    assert got["sqnr_db"] == pytest.approx(expected, abs=1e-3)
    assert 30 < got["sqnr_db"] < 60  # per-channel INT8
    assert got["numel"] == lin.weight.numel() and got["range_use"] == pytest.approx(1.0)  # max calibration


def test_activation_range_includes_the_smoothing_factor(int8_sq):
    """Layer 0's first input sees exactly the calibration activations, so under max calibration its
    largest smoothed value IS amax: range use 1, nothing clipped. Without the pre_quant_scale the
    ratio would be far from 1 (the control below)."""
    _, cand, data = int8_sq
    row = rows_of(cand, data)["model.layers.0.mlp.up_proj.input_quantizer"]
    assert row["range_use"] == pytest.approx(1.0, abs=1e-5)
    assert row["clipped"] == 0.0
    q = cand.model.layers[0].mlp.up_proj.input_quantizer
    seen = []
    h = q.register_forward_hook(lambda m, a, o: seen.append(a[0].abs().max()))
    with torch.no_grad():
        for b in data:
            cand(input_ids=b)
    h.remove()
    assert abs(float(max(seen)) / float(q.amax) - 1.0) > 0.1


def test_planted_scale_fault_is_flagged(int8_sq):
    _, cand, data = int8_sq
    q = cand.model.layers[2].mlp.up_proj.weight_quantizer
    healthy = q.amax.clone()
    try:
        q.amax = healthy * 8
        rows = rows_of(cand, data)
    finally:
        q.amax = healthy
    flagged = scales.apply_rules(list(rows.values()))
    bad = rows["model.layers.2.mlp.up_proj.weight_quantizer"]
    assert bad["range_use"] == pytest.approx(0.125)
    assert {"unused_range", "low_sqnr"} <= set(bad["flags"].split(";"))
    # 8× the step is ~18 dB less SQNR than its healthy peers
    peers = [r["sqnr_db"] for n, r in rows.items() if r["kind"] == "weight" and n != bad["quantizer"]]
    assert min(peers) - bad["sqnr_db"] > 12
    assert not any("unused_range" in r["flags"] or "low_sqnr" in r["flags"] for r in flagged if r is not bad)


def test_layers_csv_round_trip(int8_sq):
    _, cand, data = int8_sq
    rows = list(rows_of(cand, data).values())
    scales.apply_rules(rows)
    back = list(csv.DictReader(io.StringIO(layers_csv(rows))))
    assert len(back) == len(rows) and tuple(back[0]) == scales.COLUMNS
    by_name = {r["quantizer"]: r for r in back}
    for r in rows:
        assert float(by_name[r["quantizer"]]["sqnr_db"]) == pytest.approx(r["sqnr_db"], rel=1e-5)


def test_unit_glob_excludes_exactly_one_layer():
    glob = scales.unit_glob("model.layers.1")
    assert fnmatch.fnmatch("model.layers.1.mlp.up_proj.weight_quantizer", glob)
    assert not fnmatch.fnmatch("model.layers.10.mlp.up_proj.weight_quantizer", glob)
    assert not fnmatch.fnmatch("model.layers.0.mlp.up_proj.weight_quantizer", glob)


def test_exclude_glob_through_modelopt_and_effective_bits():
    """The glob the fallback writes, through qval's adapter: exactly layer 1 stays unquantized,
    and the effective bits move as worked by hand."""
    from qval.config import QuantConfig
    from qval.quantize.modelopt_adapter import quantize

    model = toy.ToyLM()
    quantize(model, QuantConfig(format="int8_sq", exclude=["*lm_head*", scales.unit_glob("model.layers.1")]), toy.batches(), "cpu")
    on = {n for n, q in iter_quantizers(model) if q.is_enabled}
    assert on and not any(n.startswith("model.layers.1.") for n in on)
    assert {scales.split_name(n)[0] for n in on} == {"model.layers.0", "model.layers.2", "model.layers.3"}
    cfg = parse_config({"name": "t", "quant": {"format": "int8_sq"}, "gates": {"agreement": {"max_mean_kld": 1}}})
    budget = weight_budget(model, cfg)
    per_layer = 2 * toy.DIM * 2 * toy.DIM  # up 32×64 + down 64×32 = 4096
    assert budget["modules"] == {f"model.layers.{i}.mlp.{p}.weight_quantizer": per_layer // 2
                                 for i in (0, 2, 3) for p in ("up_proj", "down_proj")}
    assert budget["high_precision_params"] == per_layer + toy.VOCAB * toy.DIM  # layer 1 + lm_head; not the embedding
    # (3·4096·8 + (4096 + 2048)·16) / 18432 bits
    assert effective_bits(budget) == pytest.approx((3 * 4096 * 8 + 6144 * 16) / 18432)
    assert effective_bits(budget, [scales.unit_glob("model.layers.0")]) == pytest.approx((2 * 4096 * 8 + 10240 * 16) / 18432)
    # a projection type across the layers: three down_proj of 2048
    assert kept_high(budget, ["*mlp.down_proj.*"]) == 3 * 2048
    assert effective_bits(budget, ["*mlp.down_proj.*"]) == pytest.approx((3 * 2048 * 8 + (6144 + 6144) * 16) / 18432)


def test_rules_on_hand_made_rows():
    def row(**kw):
        r = {c: None for c in scales.COLUMNS}
        r.update(kind="input", format="INT8", granularity="per-tensor", flushed=0.001, flags="")
        r.update(kw)
        return r

    rows = [row(quantizer="a", sqnr_db=40.0), row(quantizer="b", sqnr_db=41.0), row(quantizer="c", sqnr_db=29.0),
            row(quantizer="d", sqnr_db=40.0, clipped=0.002, outlier_ratio=25.0),
            row(quantizer="d2", sqnr_db=40.0, outlier_ratio=25.0, granularity="per-channel axis 0"),
            row(quantizer="e", format="FP8 E4M3", sqnr_db=30.0, outlier_ratio=25.0, flushed=0.06, pqs_spread=150.0),
            row(quantizer="f", format="FP8 E4M3", sqnr_db=30.0, flushed=0.001),
            row(quantizer="g", format="FP8 E4M3", sqnr_db=30.0, flushed=0.002),
            # 4-bit weights: 20 % flushed is their normal; 45 % is not
            row(quantizer="w1", kind="weight", format="INT4", flushed=0.20), row(quantizer="w2", kind="weight", format="INT4", flushed=0.22),
            row(quantizer="w3", kind="weight", format="INT4", flushed=0.45, range_use=0.125)]
    flagged = {r["quantizer"]: set(r["flags"].split(";")) for r in scales.apply_rules(rows)}
    # median of INT8 inputs is 40 dB: c is 11 below; FP8's outlier limit is 100, not 20; d2's scale is per channel
    assert flagged == {"c": {"low_sqnr"}, "d": {"clipping", "outlier"}, "e": {"flush", "smoothing_spread"},
                       "w3": {"flush", "unused_range"}}
    assert [r["id"] for r in scales.rules_doc()] == [r.id for r in scales.RULES]
