"""How the reports print a number (`fmt`) and read one back from report.json (`number`), shared by
report.md, report.html and their diagnostics parts."""

from __future__ import annotations

from typing import Any


def fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"  # significant digits: a standard error of 0.0025 is "0.0025", not "0"


def number(x: Any) -> Any:
    """A figure as read back from report.json, where NaN and infinities are written as strings.

    >>> number("inf"), number(0.5), number("int8")
    (inf, 0.5, 'int8')
    """
    return float(x) if isinstance(x, str) and x in ("nan", "inf", "-inf") else x
