"""Charts for report.html as small SVG documents, embedded as data-URI images.

Hand-written SVG instead of matplotlib: no dependency (matplotlib is ~40 MB and not otherwise
needed), no network and no fonts to ship, the file stays self-contained and a few kB per chart,
and an SVG scales without blurring. Only what the report needs: lines with markers, a histogram
on a log axis, ranked horizontal bars with error bars. Missing / non-finite points are skipped.
"""

from __future__ import annotations

import base64
import math
from html import escape
from typing import Sequence

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")
W, H = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 34, 48

Point = tuple[float, float]


def data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round numbers covering [lo, hi].

    >>> nice_ticks(0, 1)
    [0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
    """
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    return [start + i * step for i in range(int(math.ceil((hi - start) / step)) + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten covering [lo, hi] (lo > 0)."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    if a == b:
        b += 1
    stride = max(1, (b - a) // 8)
    return [10.0 ** e for e in range(a, b + 1, stride)]


def label(v: float) -> str:
    """Short tick text: 0, 1500, 0.25, 1e-05.

    >>> [label(x) for x in (0, 1500.0, 0.25, 1e-5, 2e6)]
    ['0', '1500', '0.25', '1e-5', '2e6']
    """
    if v == 0:
        return "0"
    if abs(v) < 1e5 and float(v).is_integer():
        return str(int(v))
    if abs(v) >= 1e5 or abs(v) < 1e-2:
        return f"{v:.0e}".replace("e-0", "e-").replace("e+0", "e")
    return f"{v:.3g}"


def labels(ticks: Sequence[float]) -> list[str]:
    """Tick texts with just enough decimals to tell neighbours apart.

    >>> labels([31.5, 31.55, 31.6]), labels([0, 500, 1000])
    (['31.5', '31.55', '31.6'], ['0', '500', '1000'])
    """
    plain = [label(t) for t in ticks]
    if len(set(plain)) == len(plain):
        return plain
    for d in range(1, 7):
        texts = [f"{t:.{d}f}".rstrip("0").rstrip(".") for t in ticks]
        if len(set(texts)) == len(texts):
            return texts
    return plain


class Scale:
    """Maps data values to pixels, linear or log10."""

    def __init__(self, lo: float, hi: float, p0: float, p1: float, log: bool = False) -> None:
        self.log = log
        self.ticks = log_ticks(lo, hi) if log else nice_ticks(lo, hi)
        self.lo, self.hi = (self.ticks[0], self.ticks[-1])
        self.p0, self.p1 = p0, p1

    def __call__(self, v: float) -> float:
        f = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo)) if self.log \
            else (v - self.lo) / ((self.hi - self.lo) or 1.0)
        return self.p0 + f * (self.p1 - self.p0)


def _frame(title: str, xlabel: str, ylabel: str, xs: Scale, ys: Scale, height: int = H, xtick_labels: bool = True,
           top: int = TOP) -> list[str]:
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" '
           'font-family="Helvetica,Arial,sans-serif" font-size="11">',
           f'<rect width="{W}" height="{height}" fill="#ffffff"/>',
           f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{escape(title)}</text>']
    for t, text in zip(ys.ticks, labels(ys.ticks)):
        y = ys(t)
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{text}</text>')
    if xtick_labels:
        for t, text in zip(xs.ticks, labels(xs.ticks)):
            x = xs(t)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{height - BOTTOM}" y2="{height - BOTTOM + 4}" stroke="#333"/>')
            out.append(f'<text x="{x:.1f}" y="{height - BOTTOM + 16}" text-anchor="middle">{text}</text>')
    out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{height - BOTTOM}" y2="{height - BOTTOM}" stroke="#333"/>')
    out.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{top}" y2="{height - BOTTOM}" stroke="#333"/>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{height - 10}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(14,{(top + height - BOTTOM) / 2}) rotate(-90)" text-anchor="middle">{escape(ylabel)}</text>')
    return out


def _range(values: Sequence[float], log: bool, include_zero: bool = True) -> tuple[float, float]:
    vals = [v for v in values if finite(v) and (v > 0 or not log)]
    if not vals:
        return (1.0, 10.0) if log else (0.0, 1.0)
    lo, hi = min(vals), max(vals)
    if not log and include_zero:
        lo = min(lo, 0.0)
    return lo, hi if hi > lo else (hi * 10 if log else hi + 1.0)


def line_chart(series: dict[str, Sequence[Point]], title: str, xlabel: str, ylabel: str, log_y: bool = False,
               include_zero: bool = True) -> str:
    """One line with markers per series; a legend above the plot when there is more than one."""
    pts = {k: [(x, y) for x, y in v if finite(x) and finite(y) and (y > 0 or not log_y)] for k, v in series.items()}
    xs_all = [x for v in pts.values() for x, _ in v]
    ys_all = [y for v in pts.values() for _, y in v]
    legend_rows = (len(pts) + 3) // 4 if len(pts) > 1 else 0
    top = TOP + 14 * legend_rows
    xs = Scale(*_range(xs_all, False, include_zero=False), LEFT, W - RIGHT)
    ys = Scale(*_range(ys_all, log_y, include_zero), H - BOTTOM, top, log=log_y)
    out = _frame(title, xlabel, ylabel, xs, ys, top=top)
    for i, (name, v) in enumerate(pts.items()):
        color = PALETTE[i % len(PALETTE)]
        if len(v) > 1:
            path = " ".join(f"{xs(x):.1f},{ys(y):.1f}" for x, y in v)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        out += [f'<circle cx="{xs(x):.1f}" cy="{ys(y):.1f}" r="2.5" fill="{color}"/>' for x, y in v]
    if len(pts) > 1:
        for i, name in enumerate(pts):
            lx, ly = LEFT + 10 + (i % 4) * 170, TOP - 8 + (i // 4) * 14
            out.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>')
            out.append(f'<text x="{lx + 14}" y="{ly + 9}">{escape(name)}</text>')
    if not ys_all:
        out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" fill="#888">no finite values to plot</text>')
    return "\n".join(out + ["</svg>"])


def histogram_chart(edges: Sequence[float], counts: Sequence[float], title: str, xlabel: str, log_x: bool = True) -> str:
    """Bars between consecutive edges (log-spaced edges on a log axis)."""
    if len(edges) < 2:
        return line_chart({}, title, xlabel, "count")
    xs = Scale(edges[0], edges[-1], LEFT, W - RIGHT, log=log_x)
    ys = Scale(0.0, max(max(counts), 1), H - BOTTOM, TOP)
    out = _frame(title, xlabel, "positions", xs, ys)
    for a, b, c in zip(edges[:-1], edges[1:], counts):
        x0, x1 = xs(a), xs(b)
        out.append(f'<rect x="{x0:.1f}" y="{ys(c):.1f}" width="{max(x1 - x0 - 0.5, 0.5):.1f}" '
                   f'height="{ys(0) - ys(c):.1f}" fill="{PALETTE[0]}"/>')
    return "\n".join(out + ["</svg>"])


def ranked_bars(items: Sequence[tuple[str, float, float | None]], title: str, xlabel: str) -> str:
    """Horizontal bars, one per (label, value, stderr), in the given order, with ±1.96·stderr whiskers."""
    return interval_bars([(n, v, v - 1.96 * e if finite(e) else None, v + 1.96 * e if finite(e) else None)
                          for n, v, e in items if finite(v)], title, xlabel)


def interval_bars(items: Sequence[tuple[str, float, float | None, float | None]], title: str, xlabel: str) -> str:
    """Horizontal bars, one per (label, value, lo, hi), in the given order, with a whisker from lo
    to hi (an asymmetric interval, e.g. Wilson's, drawn as it is)."""
    rows = [(n, v, lo, hi) for n, v, lo, hi in items if finite(v)]
    height = TOP + BOTTOM + 16 * max(len(rows), 1)
    left = 190
    vals = [v for _, v, _, _ in rows] + [x for _, _, lo, hi in rows for x in (lo, hi) if finite(x)]
    lo, hi = min(vals + [0.0]), max(vals + [0.0])
    xs = Scale(lo, hi if hi > lo else lo + 1.0, left, W - RIGHT)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" '
           'font-family="Helvetica,Arial,sans-serif" font-size="11">', f'<rect width="{W}" height="{height}" fill="#ffffff"/>',
           f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{escape(title)}</text>']
    for t, text in zip(xs.ticks, labels(xs.ticks)):
        out.append(f'<line x1="{xs(t):.1f}" x2="{xs(t):.1f}" y1="{TOP}" y2="{height - BOTTOM}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{xs(t):.1f}" y="{height - BOTTOM + 16}" text-anchor="middle">{text}</text>')
    zero = xs(0.0)
    for i, (name, v, a, b) in enumerate(rows):
        y = TOP + 16 * i
        x0, x1 = sorted((zero, xs(v)))
        color = PALETTE[0] if v >= 0 else PALETTE[1]
        out.append(f'<text x="{left - 6}" y="{y + 11}" text-anchor="end">{escape(name)}</text>')
        out.append(f'<rect x="{x0:.1f}" y="{y + 2}" width="{max(x1 - x0, 0.5):.1f}" height="11" fill="{color}"/>')
        if finite(a) and finite(b):
            out.append(f'<line x1="{xs(a):.1f}" x2="{xs(b):.1f}" y1="{y + 7.5}" y2="{y + 7.5}" stroke="#222"/>')
    out.append(f'<line x1="{zero:.1f}" x2="{zero:.1f}" y1="{TOP}" y2="{height - BOTTOM}" stroke="#333"/>')
    out.append(f'<text x="{(left + W - RIGHT) / 2}" y="{height - 10}" text-anchor="middle">{escape(xlabel)}</text>')
    return "\n".join(out + ["</svg>"])


def heatmap(rows: Sequence[str], cols: Sequence[str], values: Sequence[Sequence[float | None]], title: str,
            xlabel: str, ylabel: str, lo: float = 0.0, hi: float = 1.0, diverging: bool = False) -> str:
    """A grid of cells coloured by value (white → blue, or red ← white → blue when `diverging`),
    each cell printed with its value; None (no data) is grey."""
    cell_w = (W - LEFT - RIGHT) / max(len(cols), 1)
    cell_h = 30
    height = TOP + BOTTOM + cell_h * max(len(rows), 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" '
           'font-family="Helvetica,Arial,sans-serif" font-size="11">', f'<rect width="{W}" height="{height}" fill="#ffffff"/>',
           f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{escape(title)}</text>']

    def colour(v: float) -> str:
        if diverging:
            f = max(-1.0, min(1.0, v / (max(abs(lo), abs(hi)) or 1.0)))
            r, g, b = (255, int(255 * (1 + f)), int(255 * (1 + f))) if f < 0 else (int(255 * (1 - f)), int(255 * (1 - 0.5 * f)), 255)
        else:
            f = max(0.0, min(1.0, (v - lo) / ((hi - lo) or 1.0)))
            r, g, b = int(255 * (1 - 0.85 * f)), int(255 * (1 - 0.55 * f)), 255
        return f"rgb({r},{g},{b})"

    for i, name in enumerate(rows):
        y = TOP + cell_h * i
        out.append(f'<text x="{LEFT - 6}" y="{y + cell_h / 2 + 4}" text-anchor="end">{escape(name)}</text>')
        for j, v in enumerate(values[i]):
            x = LEFT + cell_w * j
            fill = colour(v) if finite(v) else "#dddddd"
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{cell_w - 1:.1f}" height="{cell_h - 1}" fill="{fill}"/>')
            out.append(f'<text x="{x + cell_w / 2:.1f}" y="{y + cell_h / 2 + 4}" text-anchor="middle">'
                       f'{label(v) if finite(v) else "–"}</text>')
    for j, name in enumerate(cols):
        out.append(f'<text x="{LEFT + cell_w * (j + 0.5):.1f}" y="{height - BOTTOM + 16}" text-anchor="middle">{escape(name)}</text>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{height - 10}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(14,{(TOP + height - BOTTOM) / 2}) rotate(-90)" text-anchor="middle">{escape(ylabel)}</text>')
    return "\n".join(out + ["</svg>"])
