"""The package's shape: no module under qval/ over the size one reader holds in mind (issue 13).
A module that grows past it is split along a seam (see CONTRIBUTING.md), not granted an exception."""

from __future__ import annotations

from pathlib import Path

QVAL = Path(__file__).resolve().parent.parent / "qval"
MAX_LINES = 400


def long_modules(root: Path, limit: int = MAX_LINES) -> list[str]:
    return [f"{p.relative_to(root.parent)}: {n} lines" for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > limit]


def test_no_module_is_over_400_lines():
    assert long_modules(QVAL) == []


def test_the_rule_sees_a_long_module(tmp_path: Path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "short.py").write_text("x = 1\n" * MAX_LINES)
    (pkg / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules(pkg) == [f"pkg/long.py: {MAX_LINES + 1} lines"]
