"""qval metrics: pure functions, tensors/arrays in, numbers out.

The numpy-only modules are imported here directly. The torch (`tokens`) and sacrebleu (`text`)
names are re-exported lazily (PEP 562): gates, the report and the CLI import this package, and
`qval --help` must not pay for torch. A lazy module loads on first use of one of its names.

Name clash to know about: the function `perplexity` shadows the submodule `perplexity` as an
attribute of this package (it is bound below, after the submodule loads). Import the module's
contents with `from qval.metrics.perplexity import ppl_ratio`, never `import ... as`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from qval.metrics.agreement import delta_p_summary, kld_summary, top1_summary
from qval.metrics.estimate import Estimate, mean_estimate, median_estimate, normal_ppf, proportion, quantiles
from qval.metrics.perplexity import perplexity, ppl_ratio
from qval.metrics.thresholds import Sizing, sized_threshold

_LAZY: dict[str, str] = {
    # tokens: per-position statistics from logits (torch)
    "token_stats": "tokens",
    "nll_of_targets": "tokens",
    "first_nonfinite": "tokens",
    # text: BLEU/chrF and generation health (sacrebleu)
    "bleu": "text",
    "chrf": "text",
    "bleu_tokenizer_for": "text",
    "seq_rep_n": "text",
    "distinct_n": "text",
    "detect_loop": "text",
    "windows": "text",
}

__all__ = sorted(
    [
        "Estimate", "proportion", "mean_estimate", "median_estimate", "quantiles", "normal_ppf",
        "kld_summary", "delta_p_summary", "top1_summary",
        "perplexity", "ppl_ratio",
        "Sizing", "sized_threshold",
        *_LAZY,
    ]
)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qval.metrics' has no attribute {name!r}; available: {', '.join(__all__)}")
    value = getattr(importlib.import_module(f"qval.metrics.{module}"), name)
    globals()[name] = value  # cache, so the lookup happens once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static checkers and IDEs see the lazy names too
    from qval.metrics.text import bleu, bleu_tokenizer_for, chrf, detect_loop, distinct_n, seq_rep_n, windows
    from qval.metrics.tokens import first_nonfinite, nll_of_targets, token_stats
