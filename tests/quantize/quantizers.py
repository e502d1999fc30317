"""Real ModelOpt quantizers for tests, calibrated the way mtq.quantize leaves them."""

from __future__ import annotations

import torch


def calibrated(x: torch.Tensor, **attrs):
    """A TensorQuantizer calibrated on `x` (max calibration), as mtq.quantize leaves one."""
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer

    q = TensorQuantizer(QuantizerAttributeConfig(**attrs))
    q.enable_calib()
    q.disable_quant()
    q(x)
    q.load_calib_amax()
    q.disable_calib()
    q.enable_quant()
    return q
