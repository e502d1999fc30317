"""The building blocks of report.html's sections: escaped tables, embedded SVG figures, outcome
badges, and report numbers read back from JSON."""

from __future__ import annotations

from html import escape
from typing import Any, Iterable, Sequence

from . import charts
from .formatting import outcome
from .numbers import fmt, number


class Raw(str):
    """Markup qval made itself (a PASS/FAIL badge), put into a cell unescaped."""


def num(x: Any) -> float | None:
    """A report number as a float (JSON's "nan"/"inf" strings too), or None for anything else."""
    y = number(x)
    return float(y) if isinstance(y, (int, float)) and not isinstance(y, bool) else None


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            raw = v if isinstance(v, Raw) else escape(fmt(v) if not isinstance(v, str) else v)
            cells.append(f'<td class="num">{raw}</td>' if i in numeric else f"<td>{raw}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def figure(svg: str, alt: str, caption: str = "") -> str:
    cap = f"<figcaption>{escape(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{charts.data_uri(svg)}" alt="{escape(alt)}" width="{charts.W}">{cap}</figure>'


#: how report.html marks a check's outcome, or an approval (formatting.outcome)
BADGES = {"pass": '<span class="pass">PASS</span>', "fail": '<span class="fail">FAIL</span>',
          "uninformative": '<span class="note">UNINFORMATIVE</span>'}


def badge(x: bool | str) -> Raw:
    return Raw(BADGES[outcome(x)])
