"""qval/engines/gemv.py's Triton kernels, run in Triton's interpreter (`TRITON_INTERPRET=1`: the kernels'
own code executed with numpy on the CPU), in a fresh process (the interpreter is chosen when Triton is
first imported, and torch.compile imports it for itself). Skipped where Triton is not installed (CI
installs it for this; the kernels themselves run only on a GPU, where `benchmarks/h200_issue15.py`
measures them). They must give float32 products rounded once (q/k/v of three weights in one launch,
gate/up with SiLU·mul) within the one-ulp rounding of a different summation order."""

from __future__ import annotations

import pytest
import torch

from qval.engines import gemv
from tests.engines.triton_helpers import interpreted as run_interpreted

CHECK = r'''
import json, torch, torch.nn.functional as F
from qval.engines import gemv
assert gemv._load(), gemv.missing()

def ulps(got, want, dtype=torch.bfloat16):
    spacing = torch.finfo(dtype).eps * want.float().abs().clamp_min(1e-3)
    return float(((got.float() - want.float()).abs() / spacing).max())

out = {"grouped": []}
torch.manual_seed(0)
for k, rows in [(576, [576, 192, 192]), (512, [300, 77]), (256, [1000])]:
    x = torch.randn(1, 1, k, dtype=torch.bfloat16)
    ws = [torch.randn(n, k, dtype=torch.bfloat16) * 0.05 for n in rows]
    got = gemv.grouped(x, ws)
    out["grouped"].append({"shapes": [list(o.shape) for o in got],
                           "ulps": [ulps(o, F.linear(x.double(), w.double())) for o, w in zip(got, ws)]})
k, n = 512, 700
x = torch.randn(1, 1, k, dtype=torch.bfloat16)
g, u = (torch.randn(n, k, dtype=torch.bfloat16) * 0.05 for _ in range(2))
want = F.silu(F.linear(x.double(), g.double()).bfloat16()) * F.linear(x.double(), u.double()).bfloat16()
got = gemv.gate_up_silu(x, g, u)
out["gate_up"] = {"shape": list(got.shape), "ulps": ulps(got, want)}
# 2 to 16 input rows (a batch-8 decode step): the tensor-core kernels, each output contiguous. In float16:
# Triton 3.9's interpreter multiplies bfloat16 tl.dot operands as their raw bits (seen here: products of
# ~1e11), so the kernels' shared code is checked through float16, which it computes right
out["rows"] = []
for m, k, rows in [(8, 576, [576, 192, 192]), (3, 512, [300, 77]), (16, 256, [1000])]:
    x = torch.randn(m, 1, k, dtype=torch.float16)
    ws = [torch.randn(n, k, dtype=torch.float16) * 0.05 for n in rows]
    got = gemv.grouped(x, ws)
    out["rows"].append({"shapes": [list(o.shape) for o in got], "contiguous": all(o.is_contiguous() for o in got),
                        "ulps": [ulps(o, F.linear(x.double(), w.double()), torch.float16) for o, w in zip(got, ws)]})
x = torch.randn(8, 1, 512, dtype=torch.float16)
g, u = g.half(), u.half()
want = F.silu(F.linear(x.double(), g.double()).half()) * F.linear(x.double(), u.double()).half()
got = gemv.gate_up_silu(x, g, u)
out["gate_up_rows"] = {"shape": list(got.shape), "ulps": ulps(got, want, torch.float16)}
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(CHECK, 300)


def test_grouped_gives_each_weights_product_in_one_launch(interpreted):
    rows = [[576, 192, 192], [300, 77], [1000]]
    for case, want_rows in zip(interpreted["grouped"], rows):
        assert case["shapes"] == [[1, 1, n] for n in want_rows]
        assert max(case["ulps"]) <= 1.0, case


def test_gate_up_silu_rounds_where_eager_rounds(interpreted):
    assert interpreted["gate_up"]["shape"] == [1, 1, 700]
    assert interpreted["gate_up"]["ulps"] <= 4.0  # three roundings, each of a product that may already sit one ulp apart


def test_many_rows_give_each_row_its_product(interpreted):
    for case, (m, rows) in zip(interpreted["rows"], [(8, [576, 192, 192]), (3, [300, 77]), (16, [1000])]):
        assert case["shapes"] == [[m, 1, n] for n in rows] and case["contiguous"], case
        assert max(case["ulps"]) <= 1.0, case
    assert interpreted["gate_up_rows"]["shape"] == [8, 1, 700]
    assert interpreted["gate_up_rows"]["ulps"] <= 4.0


def test_block_table_and_what_it_cannot_address():
    assert gemv.block(6144, 4096) == (8, 512, 4, 3)  # q/k/v of an 8B layer
    assert gemv.block(2 * 14336, 4096) == (16, 256, 4, 3)
    assert gemv.block(4096, 14336) == (4, 1024, 4, 1)  # 14,336 = 14 × 1,024
    assert gemv.block(4096, 100) is None  # no block divides 100
    w = torch.zeros(8, 64, dtype=torch.bfloat16)
    assert not gemv.usable(torch.zeros(1, 1, 64, dtype=torch.bfloat16), [w])  # a CPU tensor
