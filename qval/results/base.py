"""What every gate's typed details share: strict keys (a key the type does not name is an error, on
writing and on reading back), report.json's exact key set kept (a field not given is not written),
and one error for a stored result that does not match its type.

Torch-free: the judges and the renderers read these types; report.json stays their `to_dict()`.
"""

from __future__ import annotations

from typing import Any, TypeVar, Union

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from ..errors import DataError

#: a figure as the gate computed it: an int stays an int and a float a float (NaN included), so report.json
#: and the text rendered from it are the same as from the plain dict the type replaced
Num = Union[int, float]
#: an `Estimate.to_dict()` (value, stderr, lo, hi, n): read by the renderers' `estimate`/`interval`
EstimateDict = dict[str, Any]

T = TypeVar("T", bound="Block")


class Block(BaseModel):
    """A typed part of a gate's details. Unknown keys are refused; `to_dict` writes the keys that were
    given (a field left out stays out of report.json, as before the types)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_unset=True)


class Details(Block):
    """A gate's details: each gate's type adds its own fields."""

    #: this gate's use of the snapshot reference (reference calls computed / read back), set by whoever ran
    #: the gate (pipeline._finish), absent without a snapshot
    snapshot: dict[str, Any] | None = None


def parse(cls: type[T] | TypeAdapter[Any], data: Any, where: str) -> Any:
    """`data` (a stored result's details, or a part of them read through a TypeAdapter) as `cls`, or a
    DataError naming the first mismatch."""
    if isinstance(cls, type) and isinstance(data, cls):
        return data
    try:
        return cls.model_validate(data) if isinstance(cls, type) else cls.validate_python(data)
    except ValidationError as e:
        first = e.errors()[0]
        at = ".".join(str(x) for x in first.get("loc", ())) or "(top)"
        raise DataError(f"{where}: its details do not match the gate's result type at {at!r} ({first.get('msg')}; "
                        f"{e.error_count()} mismatch{'es' if e.error_count() > 1 else ''}); it was written by another "
                        "qval version or edited: run the gate again (delete its stage folder) or render the report "
                        "with the qval that wrote it.") from None
