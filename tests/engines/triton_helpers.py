"""Shared by the tests of qval's Triton kernels (test_gemv.py, test_decode_kernel.py, test_fused_step.py,
test_leanfp8.py): running a check in Triton's interpreter, and stand-ins for gemv.py's kernels."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]


def interpreted(code: str, timeout: int) -> Any:
    """The JSON that `code` prints last, run in a fresh process with `TRITON_INTERPRET=1` (the
    interpreter is chosen when Triton is first imported, and torch.compile imports it for itself);
    the test is skipped where Triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def gemv_standins(launches: list) -> tuple[Any, Any]:
    """`gemv.grouped` and `gemv.gate_up_silu` with F.linear's arithmetic, each call recorded in
    `launches` (the weights' output rows; gate/up as ("gate_up", rows))."""

    def grouped(x, weights):  # noqa: ANN001, ANN202
        launches.append(tuple(w.shape[0] for w in weights))
        return [F.linear(x, w) for w in weights]

    def gate_up_silu(x, g, u):  # noqa: ANN001, ANN202
        launches.append(("gate_up", g.shape[0]))
        return F.silu(F.linear(x, g)) * F.linear(x, u)

    return grouped, gate_up_silu
