"""Text and token-sequence metrics: corpus BLEU/chrF (gate 2) and generation health (gate 3).

BLEU and chrF go straight through sacrebleu (no `evaluate.load`, which needs the hub), and the
signature string is returned with the score so a report states exactly how it was computed.
The sequence metrics work on token ids, so they need no tokenizer and treat every language alike.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

# Language codes that mean Chinese; BLEU on Chinese needs the "zh" tokenizer, because 13a
# splits on spaces and unsegmented Chinese would be scored as one token per sentence.
_CHINESE = {"zh", "zho", "chi", "cmn", "chinese"}


def _check_corpus(hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"need one reference per hypothesis, got {len(hyps)} hypotheses and {len(refs)} references")
    if not hyps:
        raise ValueError("cannot score an empty corpus: no hypotheses were given")


def bleu(hyps: list[str], refs: list[str], *, tokenize: str = "13a") -> tuple[float, str]:
    """Corpus BLEU (one reference per segment) and sacrebleu's signature.

    >>> score, sig = bleu(["the cat sat on the mat"], ["the cat sat on the mat"])
    >>> round(score, 6), "tok:13a" in sig
    (100.0, True)
    """
    _check_corpus(hyps, refs)
    metric = BLEU(tokenize=tokenize)
    return float(metric.corpus_score(hyps, [refs]).score), str(metric.get_signature())


def chrf(hyps: list[str], refs: list[str]) -> tuple[float, str]:
    """Corpus chrF (character n-gram F-score, sacrebleu defaults) and its signature.

    >>> score, sig = chrf(["abc def"], ["abc def"])
    >>> score, sig.startswith("nrefs:1")
    (100.0, True)
    """
    _check_corpus(hyps, refs)
    metric = CHRF()
    return float(metric.corpus_score(hyps, [refs]).score), str(metric.get_signature())


def bleu_tokenizer_for(lang: str) -> str:
    """sacrebleu tokenizer for a language code: "zh" for Chinese (any region/script), else "13a".

    >>> [bleu_tokenizer_for(x) for x in ("zh", "zh-CN", "zh_Hant", "en", "de")]
    ['zh', 'zh', 'zh', '13a', '13a']
    """
    base = lang.strip().lower().replace("_", "-").split("-")[0]
    return "zh" if base in _CHINESE else "13a"


def _ngrams(tokens: Sequence[int], n: int) -> list[tuple[int, ...]]:
    if n < 1:
        raise ValueError(f"n-gram order must be >= 1, got n={n}")
    toks = list(tokens)
    return [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]


def seq_rep_n(tokens: Sequence[int], n: int = 4) -> float:
    """Share of repeated n-grams, 1 − |unique n-grams| / |n-grams| (Welleck et al. 2019).

    0 for fresh text, towards 1 for a degenerate loop; 0.0 when the text has no n-gram.
    >>> seq_rep_n([1, 2, 3, 4, 1, 2, 3, 4], n=4)  # 5 four-grams, 4 distinct
    0.2
    """
    grams = _ngrams(tokens, n)
    # (total − unique) / total equals 1 − unique/total but without the rounding of the subtraction.
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def distinct_n(tokens: Sequence[int], n: int = 2) -> float:
    """Share of distinct n-grams, |unique n-grams| / |n-grams|; 0.0 when there is none.

    >>> distinct_n([1, 1, 1, 2], n=2)  # (1,1) (1,1) (1,2): 2 distinct of 3
    0.6666666666666666
    """
    grams = _ngrams(tokens, n)
    return len(set(grams)) / len(grams) if grams else 0.0


def detect_loop(tokens: Sequence[int], *, max_period: int = 64, span: int = 256) -> int | None:
    """Smallest period p ≤ max_period with which the last `span` tokens repeat exactly, else None.

    "A loop repeating through the last 256" means the whole tail is stuck: every one of the last
    `span` tokens equals the token p places before it. Periodicity is checked against tokens that
    really exist (i − p inside the sequence), so a period needs span + p tokens to be confirmed;
    a shorter sequence cannot prove the loop for that period. A loop that stopped before the tail
    is not reported: the model recovered, which seq-rep-n still records.
    >>> detect_loop([9, 8] + [1, 2, 3] * 10, max_period=8, span=12)
    3
    >>> detect_loop([1, 2, 3] * 10 + [7], max_period=8, span=12) is None
    True
    """
    if max_period < 1 or span < 1:
        raise ValueError(f"detect_loop needs max_period >= 1 and span >= 1, got {max_period}, {span}")
    arr = np.asarray(list(tokens), dtype=np.int64)
    length = arr.size
    tail = arr[length - span :] if length >= span else None
    for p in range(1, max_period + 1):
        if tail is None or length < span + p:
            break  # longer periods need even more tokens, so none of them can be confirmed either
        if np.array_equal(tail, arr[length - span - p : length - p]):
            return p
    return None


def windows(n_positions: int, window: int) -> list[tuple[int, int]]:
    """Consecutive full [start, end) windows over n_positions; a short remainder is dropped.

    Dropped, not kept short, because gate 3 compares windows with one another (late vs early):
    a short window's mean is noisier and would weigh a handful of tokens like a full window.
    >>> windows(600, 256)
    [(0, 256), (256, 512)]
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if n_positions < 0:
        raise ValueError(f"n_positions must be >= 0, got {n_positions}")
    return [(s, s + window) for s in range(0, n_positions - window + 1, window)]
