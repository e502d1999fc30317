"""Formats as ModelOpt's unified HF checkpoint declares them, read from the format specs.

Each exportable format's `ExportSpec` (`qval.quantize.formats`) says the name ModelOpt writes into
`hf_quant_config.json` (`quant_algo`), the stored weight dtype, the tensors every quantized layer
must carry and its decoder (`codecs.py`); this module turns those into the look-ups the reader,
the fidelity check and the export engines need.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..quantize.formats import FORMATS, ExportSpec

#: qval formats that qval can export and read back, sorted (the order messages list them)
EXPORTABLE = [n for n in FORMATS.names() if FORMATS.get(n).export is not None]

#: quant_algo in hf_quant_config.json -> qval format
BY_QUANT_ALGO = {FORMATS.get(n).export.quant_algo: n for n in EXPORTABLE}  # type: ignore[union-attr]

#: kv_cache_quant_algo ModelOpt writes for each qval KV-cache setting
KV_ALGO = {"fp16": None, "fp8": "FP8"}


def export_spec(fmt: str) -> ExportSpec:
    """The export of qval format `fmt` (a ConfigError naming the exportable ones if it has none)."""
    spec = FORMATS.get(fmt).export
    if spec is None:
        raise ConfigError(f"quantization format {fmt!r} has no export; exportable: {', '.join(EXPORTABLE)}.")
    return spec


def check_exportable(fmt: str, where: str) -> None:
    """A ConfigError unless qval can export `fmt` and read it back (its fidelity check decodes only
    the formats with an export, so any other export could never pass)."""
    if fmt not in EXPORTABLE:
        raise ConfigError(f"{where}: quant.format {fmt} cannot be gated as an export: qval exports and reads back "
                          f"{', '.join(EXPORTABLE)}; pick one of those or engine: {{backend: fakequant}}.")
