"""Shared by the reliability tests: run the CLI in-process and insist on a clean exit-2 error,
and a toy reference (tests/diagnostics/toy.py behind a byte tokenizer) that calibrates in a second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from qval.cli import app

runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    """(exit code, stdout + stderr) of `qval ARGS`."""
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def clean_error(*args: str) -> str:
    """`qval ARGS` must fail with exit 2, one `qval: error:` message and no traceback; returns the output."""
    code, out = cli(*args)
    assert code == 2, f"exit {code}, not 2:\n{out}"
    assert "qval: error:" in out and "Traceback" not in out, out
    return out


class ByteTokenizer:
    """Just what calibration needs of a tokenizer: bytes mod the toy vocabulary, an EOS id."""

    eos_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        from tests.diagnostics.toy import VOCAB

        return {"input_ids": [1 + b % (VOCAB - 1) for b in text.encode("utf-8")]}


def toy_reference() -> Any:
    from qval.models import LoadedModel
    from tests.diagnostics.toy import ToyLM

    return LoadedModel(model=ToyLM().eval(), tokenizer=ByteTokenizer(), name="toy", fingerprint="toy", device="cpu",
                       requested_dtype="float32", compute_dtype="float32")


def tiny_calibration(tmp_path: Path) -> dict[str, Any]:
    """A calibration section that reads a few KB: 2 samples of 64 byte-tokens."""
    data = tmp_path / "calib.jsonl"
    data.write_text("".join(f'{{"text": "calibration text number {i}, long enough to fill a window of tokens."}}\n'
                            for i in range(8)), encoding="utf-8")
    return {"dataset": str(data), "samples": 2, "seq_len": 64, "batch_size": 2}
