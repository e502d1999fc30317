"""The package surface: re-exports resolve, imports stay light, docstring examples are true."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys

import pytest

import qval.metrics

MODULES = ["estimate", "tokens", "rows", "agreement", "perplexity", "thresholds", "text"]
PUBLIC = {
    "Estimate", "proportion", "mean_estimate", "median_estimate", "quantiles", "normal_ppf",
    "token_stats", "nll_of_targets", "first_nonfinite",
    "kld_summary", "delta_p_summary", "top1_summary",
    "perplexity", "ppl_ratio", "Sizing", "sized_threshold",
    "bleu", "chrf", "bleu_tokenizer_for", "seq_rep_n", "distinct_n", "detect_loop", "windows",
}


def test_public_names_resolve_to_their_modules() -> None:
    assert set(qval.metrics.__all__) == PUBLIC
    for name in PUBLIC:
        obj = getattr(qval.metrics, name)
        assert obj.__module__.startswith("qval.metrics."), name
    with pytest.raises(AttributeError, match="available"):
        qval.metrics.no_such_metric  # noqa: B018


def test_light_modules_do_not_import_torch_or_sacrebleu() -> None:
    # Gates, report and CLI import qval.metrics; `qval --help` must not pay for torch.
    code = (
        "import sys; from qval.metrics import proportion, sized_threshold, kld_summary, ppl_ratio; "
        "print('torch' in sys.modules, 'sacrebleu' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_perplexity_function_wins_over_its_submodule() -> None:
    # Importing the submodule first must not leave `qval.metrics.perplexity` as a module.
    code = (
        "from qval.metrics.perplexity import ppl_ratio; import qval.metrics.perplexity; "
        "from qval.metrics import perplexity; print(callable(perplexity), type(perplexity).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "function"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(f"qval.metrics.{name}")
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
