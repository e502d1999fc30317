"""Where the run goes cannot take it: --out naming a file, a read-only folder, a disk that fills up
while a stage writes. Each is exit 2 with what was being written and what to do.

The read-only and disk-full cases mount small tmpfs file systems (the tests run as root); where
mount is not allowed they are skipped, and `test_enospc_simulated` still covers the full disk by
making the write raise ENOSPC (a monkeypatch).
"""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest
import torch

from qval import pipeline
from qval.errors import StorageError
from qval.io import atomic_write, atomic_write_text
from qval.stages import RunDir
from tests.conftest import small_config, write_config

from .helpers import clean_error, tiny_calibration, toy_reference


def _mount(folder: Path, options: str) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True).returncode == 0


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs, unmounted afterwards."""
    folder = tmp_path / "small"
    if not _mount(folder, "size=1m"):
        pytest.skip("cannot mount a tmpfs here (not root?); test_enospc_simulated covers the full disk")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def test_out_naming_a_file(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    cfg = write_config(tmp_path, small_config("cand", fmt="none"))
    out = clean_error("calibrate", "--config", cfg, "--out", tmp_path / "file", "-q")
    assert f"{tmp_path / 'file'} is a file, not a folder; give --out (or report.dir) a folder" in out


def test_out_naming_a_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    if not _mount(ro, "ro,size=1m"):
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        cfg = write_config(tmp_path, small_config("cand", fmt="none"))
        out = clean_error("calibrate", "--config", cfg, "--out", ro, "-q")
        assert f"{ro / 'cand'}: cannot create the run folder (Read-only file system)" in out
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def test_existing_run_folder_that_became_read_only(tmp_path):
    disk = tmp_path / "disk"
    if not _mount(disk, "size=1m"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        (disk / "cand").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        cfg = write_config(tmp_path, small_config("cand", fmt="none"))
        out = clean_error("calibrate", "--config", cfg, "--out", disk, "-q")
        assert f"{disk / 'cand'}: cannot write in the run folder (Read-only file system)" in out
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_text_write_on_a_full_disk_says_how_much_was_needed(tmpfs):
    target = tmpfs / "gate_agreement" / "result.json"
    with pytest.raises(StorageError) as err:
        atomic_write_text(target, "x" * (2 << 20))
    msg = str(err.value)
    assert f"{target}: no space left on the device while writing result.json (stage gate_agreement)" in msg
    assert "of about 2.0 MiB needed" in msg and "free some space" in msg.lower() and "--out" in msg
    assert list((tmpfs / "gate_agreement").iterdir()) == []  # no temporary file left behind


def test_torch_save_on_a_full_disk(tmpfs):
    """torch.save reports a full disk as a RuntimeError without errno; it is still named a full disk."""
    from qval.quantize.modelopt_adapter import save_state

    with pytest.raises(StorageError, match=r"while writing quant_state.pt \(stage calibrate\).*of about 4.0 MiB needed"):
        save_state(torch.nn.Linear(1024, 1024), {}, tmpfs / "calibrate" / "quant_state.pt")


def test_calibrate_on_a_full_disk_through_the_cli(tmp_path, tmpfs, monkeypatch):
    from qval.quantize import modelopt_adapter

    real_save = modelopt_adapter.save_state
    big = torch.nn.Linear(1024, 1024)  # 4 MiB of weights: more than the 1 MiB disk holds
    monkeypatch.setattr("qval.run_reference.load_model", lambda cfg: toy_reference())
    monkeypatch.setattr(modelopt_adapter, "save_state", lambda model, ref, path: real_save(big, {}, path))
    cfg = write_config(tmp_path, small_config("toy", calibration=tiny_calibration(tmp_path)))
    out = clean_error("calibrate", "--config", cfg, "--out", tmpfs, "-q")
    assert f"{tmpfs / 'toy' / 'calibrate' / 'quant_state.pt'}: no space left on the device" in out
    assert "finished stages are kept" in out
    assert not (tmpfs / "toy" / "calibrate" / "done.json").exists()  # the stage is not marked finished


def test_enospc_simulated(tmp_path):
    def writer(p: Path) -> None:
        p.write_bytes(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device", str(p))

    with pytest.raises(StorageError, match=r"result.json \(stage st\): 1000 bytes written of about 100000 bytes needed"):
        atomic_write(tmp_path / "st" / "result.json", writer, needed=100_000)
    assert list((tmp_path / "st").iterdir()) == []


def test_run_dir_under_a_file_is_a_storage_error(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(StorageError, match="is a file, not a folder"):
        RunDir(tmp_path / "f" / "deeper", "cand")
