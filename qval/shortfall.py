"""Shortfall: a gate or stage that gets less data than its config asks for says so, and past
`max_shortfall` (a fraction of the budget, top-level config key) it is an error, not a verdict.

One rule for every budget (calibration samples, gate 1 tokens, depth tokens, gate 3 prompts),
used both by the gates when they run and by `qval validate`'s preflight before any model loads.
"""

from __future__ import annotations

from .errors import DataError


def shortfall(where: str, asked: int, got: int, unit: str, max_fraction: float) -> str | None:
    """None when `got` meets `asked`; a note when less is there but within `max_fraction`;
    a DataError when more than `max_fraction` of the budget is missing.

    >>> shortfall("gates.agreement.tokens", 1000, 1000, "tokens", 0.5) is None
    True
    >>> shortfall("gates.agreement.tokens", 1000, 750, "tokens", 0.5)
    'gates.agreement.tokens: asked for 1000 tokens, the data holds 750 (25% short)'
    """
    if got >= asked:
        return None
    missing = 1 - got / asked
    note = f"{where}: asked for {asked} {unit}, the data holds {got} ({missing:.0%} short)"
    if missing > max_fraction:
        raise DataError(f"shortfall beyond max_shortfall = {max_fraction:g}: {note}. Give more data or a smaller "
                        f"budget, or raise max_shortfall (a fraction of the budget, default 0.5).")
    return note
