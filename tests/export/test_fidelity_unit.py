"""The fidelity comparison and the export's atomic replacement, on small hand-made inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qval.errors import StageError
from qval.export.fidelity import compare_codes
from qval.export.hf import _replace_folder, check_exportable


def test_compare_codes_equal_tie_mismatch():
    # step 2: 3.0 lies exactly between 2 and 4 (a tie: either rounding is right); 5.2 is nearer 6
    w = torch.tensor([1.0, 3.0, 5.2, -7.0])
    expected = torch.tensor([1.0, 4.0, 6.0, -8.0])
    decoded = torch.tensor([1.0000001, 2.0, 4.0, -6.0])
    out = compare_codes(decoded, expected, w)
    assert out["counts"] == {"n": 4, "equal": 1, "ties": 2, "mismatches": 1}
    assert out["first_mismatch"]["index"] == 2 and out["max_abs_error"] == pytest.approx(2.0)


def test_compare_codes_one_ulp_is_equal():
    e = torch.tensor([0.1234, -3.5])
    d = torch.nextafter(e, torch.tensor([1.0, 1.0]))  # one float32 ulp away
    assert compare_codes(d, e, e)["counts"]["equal"] == 2


def test_replace_folder_swaps_whole_folders(tmp_path: Path):
    dest, new = tmp_path / "export", tmp_path / ".export.partial"
    dest.mkdir(); (dest / "old.txt").write_text("old")
    new.mkdir(); (new / "new.txt").write_text("new")
    _replace_folder(new, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["new.txt"]
    assert not new.exists() and not (tmp_path / ".export.old").exists()


def test_partial_awq_blocks_are_refused_with_a_fix():
    import modelopt.torch.quantization as mtq

    model = torch.nn.Sequential(torch.nn.Linear(96, 32, bias=False))
    cfg = {"quant_cfg": [{"quantizer_name": "*weight_quantizer", "cfg": {"num_bits": 4, "block_sizes": {-1: 64}}},
                         {"quantizer_name": "*input_quantizer", "enable": False}], "algorithm": "max"}
    mtq.quantize(model, cfg, forward_loop=lambda m: m(torch.randn(2, 96)))
    with pytest.raises(StageError, match=r"input width 96, not a multiple of the block size 64.*awq_block_size to 32"):
        check_exportable(model)


# --- the export_fidelity gate: its typed result, its checks, its section in report.md -----------------------

def _fidelity(**edits):
    """A fidelity report as the build writes it (qval.export.build: the FidelityReport's dict and its cache key)."""
    fid = {"key": "k", "passed": True,
           "checks": [{"name": "layer_coverage", "ok": True, "severity": "error", "detail": "210 layers"},
                      {"name": "weights_equal", "ok": True, "severity": "error", "detail": "all equal"},
                      {"name": "resmoothed", "ok": False, "severity": "warn", "detail": "2 layers re-smoothed"}],
           "totals": {"layers": 210, "n": 1000, "equal": 998, "ties": 2, "mismatches": 0, "bad_layers": 0},
           "changed_at_export": [{"layer": "model.layers.0.mlp.up_proj", "changes": ["weight re-smoothed and re-quantized"]}],
           "layers": [{"layer": "model.layers.0.mlp.up_proj", "dtype": "float8_e4m3fn"}]}
    fid.update(edits)
    return fid


def _run_gate(fid):
    from types import SimpleNamespace

    from qval.gates import GATES  # the gate as the pipeline finds it

    return GATES.get("export_fidelity").run(SimpleNamespace(candidate=SimpleNamespace(fidelity=fid), config=SimpleNamespace(engine=SimpleNamespace(backend="export"))))


def test_the_export_gate_returns_its_type_and_reads_back_the_same():
    import json

    from qval.gates.export_fidelity.result import ExportFidelityDetails
    from qval.verdict import GateResult

    r = _run_gate(_fidelity())
    assert r.status == "ok" and isinstance(r.details, ExportFidelityDetails)
    assert r.details.notes == ["resmoothed: 2 layers re-smoothed"] and r.measurements["failed_checks"].value == 0.0
    stored = json.loads(json.dumps(r.to_dict()))
    assert "layers" not in stored["details"] and "key" not in stored["details"]  # per-layer rows stay in fidelity.json
    back = GateResult.from_dict(stored)
    assert isinstance(back.details, ExportFidelityDetails) and back.to_dict() == stored


def test_a_failed_fidelity_check_rejects_and_report_md_notes_it():
    from qval.gates.export_fidelity.judge import thresholds
    from qval.gates.export_fidelity import section as export_fidelity
    from qval.verdict import decide

    checks = _fidelity()["checks"]
    checks[1] = {**checks[1], "ok": False, "detail": "3 weights decode to another value"}
    r = _run_gate(_fidelity(passed=False, checks=checks, totals={**_fidelity()["totals"], "mismatches": 3}))
    v = decide({"export_fidelity": r}, thresholds(None, r))  # type: ignore[arg-type]
    assert not v.approved and {c.metric for c in v.failures} == {"failed_checks", "weight_mismatches"}
    lines = "\n".join(export_fidelity.markdown(r.to_dict()))
    assert "| failed_checks | 1 |" in lines and "Note: weights_equal: 3 weights decode to another value" in lines


def test_a_fidelity_report_of_another_shape_is_a_data_error():
    from qval.errors import DataError

    with pytest.raises(DataError, match=r"engine export's fidelity report: .*'totalz'"):
        _run_gate(_fidelity(totalz={}))
    with pytest.raises(DataError, match=r"'checks\.0\.severity'"):
        _run_gate(_fidelity(checks=[{"name": "x", "ok": True, "detail": "no severity"}]))
