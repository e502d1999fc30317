"""A config or data file with a byte that is not UTF-8: exit 2 naming the file, the byte, its offset
and line, never a UnicodeDecodeError traceback."""

from __future__ import annotations

import pytest

from qval.data import load_dataset
from qval.errors import DataError
from tests.conftest import small_config, write_config

from .helpers import clean_error


def test_config_with_a_latin1_byte(tmp_path):
    path = write_config(tmp_path, small_config("enc"))
    text = path.read_bytes()
    path.write_bytes(text + b"description: caf\xe9\n")  # latin-1 'é'
    out = clean_error("validate", "--config", path)
    offset = len(text) + len(b"description: caf")
    assert f"{path}: byte 0xe9 at offset {offset}" in out and "is not UTF-8" in out and "save the file as UTF-8" in out


@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_data_file_with_a_bad_byte(tmp_path, suffix):
    data = tmp_path / f"heldout{suffix}"
    good = b'{"text": "fine"}\n' if suffix == ".jsonl" else b"fine\n\n"
    data.write_bytes(good + (b'{"text": "\xff"}\n' if suffix == ".jsonl" else b"\xff\n"))
    offset = len(good) + (len(b'{"text": "') if suffix == ".jsonl" else 0)
    line = good.count(b"\n") + 1
    with pytest.raises(DataError, match=rf"byte 0xff at offset {offset} \(line {line}\) is not UTF-8"):
        load_dataset(str(data))


def test_data_file_with_a_bad_byte_through_the_cli(tmp_path):
    cfg = small_config("enc")
    bad = tmp_path / "calib.jsonl"
    bad.write_bytes(b'{"text": "ok"}\n{"text": "\xc3("}\n')  # a broken two-byte sequence
    cfg["calibration"]["dataset"] = str(bad)
    out = clean_error("calibrate", "--config", write_config(tmp_path, cfg), "--out", tmp_path / "r", "-q")
    assert f"{bad}: byte 0xc3 at offset 25 (line 2)" in out
