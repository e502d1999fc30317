"""`GatesConfig`, the config's `gates:` section: one field per gate section `qval.gate_registry` declares, in
the sections' order, each gate's model from its package's `config.py`. Left out, a section is its gate's
defaults with `enabled` as the gate declares (`enabled_by_default`: gate 1 on, the others off).
The rules across sections (`_quality_fits_agreement`) are here.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, create_model, model_validator

from .config_base import Strict
from .gate_decl import GateDecl
from .gate_registry import sections


def _default(d: GateDecl) -> Any:
    """The section a config that leaves it out gets."""
    cls = d.config
    return Field(default_factory=cls) if d.enabled_by_default else Field(default_factory=lambda: cls(enabled=False))


_Sections: Any = create_model("GatesConfig", __base__=Strict, __module__=__name__,
                              **{d.name: (d.config, _default(d)) for d in sections()})


class GatesConfig(_Sections):
    @model_validator(mode="after")
    def _quality_fits_agreement(self) -> "GatesConfig":
        q, a = self.quality, self.agreement
        if q.enabled and q.windowing == "chunks" and not a.enabled:
            raise ValueError("gates.quality with windowing: chunks scores gate 1's positions, but gates.agreement is "
                             "disabled; enable it, or set quality.windowing: sliding")
        if q.enabled and q.stride is not None and q.stride > a.ctx:
            raise ValueError(f"gates.quality.stride ({q.stride}) is longer than the window (gates.agreement.ctx = {a.ctx})")
        return self
