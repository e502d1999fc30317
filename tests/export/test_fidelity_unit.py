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
