"""qval.metrics.text: sacrebleu itself as the reference, hand-worked n-gram counts, planted loops."""

from __future__ import annotations

import random

import pytest
from sacrebleu.metrics import BLEU, CHRF

from qval.metrics.text import bleu, bleu_tokenizer_for, chrf, detect_loop, distinct_n, seq_rep_n, windows

EN_HYPS = ["The cat sat on the mat.", "It is raining heavily today!", "He reads a book in the garden."]
EN_REFS = ["The cat is sitting on the mat.", "It rains heavily today.", "He is reading a book in the garden."]
ZH_HYPS = ["今天天气很好，我们去公园散步。", "他正在图书馆看书。", "这只猫坐在垫子上。"]
ZH_REFS = ["今天天气不错，我们去公园散步吧。", "他在图书馆里读书。", "猫坐在垫子上。"]


def test_bleu_english_equals_sacrebleu() -> None:
    want = BLEU(tokenize="13a")
    want_score = want.corpus_score(EN_HYPS, [EN_REFS]).score
    score, sig = bleu(EN_HYPS, EN_REFS)
    assert score == want_score
    assert sig == str(want.get_signature())
    assert "tok:13a" in sig and "nrefs:1" in sig
    assert 0.0 < score < 100.0


def test_bleu_chinese_equals_sacrebleu_zh() -> None:
    tok = bleu_tokenizer_for("zh-CN")
    want = BLEU(tokenize="zh")
    score, sig = bleu(ZH_HYPS, ZH_REFS, tokenize=tok)
    assert score == want.corpus_score(ZH_HYPS, [ZH_REFS]).score
    assert sig == str(want.get_signature()) and "tok:zh" in sig
    # Why the tokenizer matters: 13a sees each unsegmented Chinese sentence as one word.
    assert score > bleu(ZH_HYPS, ZH_REFS, tokenize="13a")[0]


def test_chrf_equals_sacrebleu() -> None:
    for hyps, refs in [(EN_HYPS, EN_REFS), (ZH_HYPS, ZH_REFS)]:
        want = CHRF()
        score, sig = chrf(hyps, refs)
        assert score == want.corpus_score(hyps, [refs]).score
        assert sig == str(want.get_signature())


def test_identical_and_mismatched_corpora() -> None:
    assert bleu(EN_REFS, EN_REFS)[0] == pytest.approx(100.0)
    assert chrf(EN_REFS, EN_REFS)[0] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="one reference per hypothesis"):
        bleu(EN_HYPS, EN_REFS[:2])
    with pytest.raises(ValueError, match="empty"):
        chrf([], [])


@pytest.mark.parametrize(
    "lang, tok",
    [("zh", "zh"), ("zh-cn", "zh"), ("zh-TW", "zh"), ("zh_Hans", "zh"), ("ZH", "zh"), ("zho", "zh"),
     ("en", "13a"), ("de", "13a"), ("ja", "13a"), ("", "13a")],
)
def test_bleu_tokenizer_for(lang: str, tok: str) -> None:
    assert bleu_tokenizer_for(lang) == tok


def test_seq_rep_n_hand_worked() -> None:
    # 1 2 3 4 1 2 3 4: 4-grams 1234 2341 3412 4123 1234 -> 5 total, 4 unique -> 1 − 4/5 = 0.2.
    assert seq_rep_n([1, 2, 3, 4, 1, 2, 3, 4], n=4) == pytest.approx(0.2)
    # Ten 5s: seven 4-grams, all (5,5,5,5) -> 1 − 1/7 = 6/7.
    assert seq_rep_n([5] * 10) == pytest.approx(6 / 7)
    assert seq_rep_n(list(range(100))) == 0.0
    assert seq_rep_n([1, 2, 3]) == 0.0  # no 4-gram at all
    with pytest.raises(ValueError):
        seq_rep_n([1, 2], n=0)


def test_distinct_n_hand_worked() -> None:
    # 1 1 1 2: bigrams 11 11 12 -> 2 unique of 3.
    assert distinct_n([1, 1, 1, 2]) == pytest.approx(2 / 3)
    assert distinct_n([1, 2, 3, 4]) == 1.0
    assert distinct_n([7] * 50) == pytest.approx(1 / 49)
    assert distinct_n([3]) == 0.0 and distinct_n([]) == 0.0
    assert distinct_n([1, 2, 1, 2, 1], n=1) == pytest.approx(2 / 5)


def test_ngram_metrics_match_independent_counting() -> None:
    rng = random.Random(0)
    for _ in range(50):
        toks = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        for n in (1, 2, 4):
            grams = list(zip(*(toks[i:] for i in range(n))))
            if not grams:
                assert seq_rep_n(toks, n) == 0.0 and distinct_n(toks, n) == 0.0
                continue
            counts: dict[tuple[int, ...], int] = {}
            for g in grams:
                counts[g] = counts.get(g, 0) + 1
            assert distinct_n(toks, n) == pytest.approx(len(counts) / len(grams))
            assert seq_rep_n(toks, n) == pytest.approx(1 - len(counts) / len(grams))


def _random_tokens(k: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(k)]


@pytest.mark.parametrize("period", [1, 7, 64])
def test_planted_loop_found_with_its_period(period: int) -> None:
    unit = _random_tokens(period, seed=period)
    assert len(set(unit)) == period  # a unit with no smaller period of its own
    toks = _random_tokens(100, seed=99) + unit * (400 // period + 1)
    assert detect_loop(toks) == period


def test_random_text_has_no_loop() -> None:
    assert detect_loop(_random_tokens(2048, seed=1)) is None
    assert detect_loop([t % 10 for t in _random_tokens(2048, seed=2)]) is None  # small alphabet too


def test_loop_that_stopped_before_the_tail_is_not_a_loop() -> None:
    toks = _random_tokens(50, seed=3) + [11, 12, 13, 14, 15] * 100 + _random_tokens(40, seed=4)
    assert detect_loop(toks) is None
    assert seq_rep_n(toks) > 0.5  # the repetition is still visible to seq-rep-n


def test_loop_needs_span_plus_period_tokens() -> None:
    unit = list(range(100, 107))  # period 7
    assert detect_loop((unit * 40)[:262]) is None  # 262 < 256 + 7: cannot confirm
    assert detect_loop((unit * 40)[:263]) == 7
    assert detect_loop([4] * 256) is None and detect_loop([4] * 257) == 1
    assert detect_loop(list(range(65)) * 10) is None  # period 65 is beyond max_period=64
    assert detect_loop(list(range(65)) * 10, max_period=65) == 65


def test_detect_loop_matches_brute_force() -> None:
    def brute(toks: list[int], max_period: int, span: int) -> int | None:
        for p in range(1, max_period + 1):
            idx = range(len(toks) - span, len(toks))
            if len(toks) - span - p >= 0 and all(toks[i] == toks[i - p] for i in idx):
                return p
        return None

    rng = random.Random(5)
    for _ in range(300):
        period = rng.randrange(1, 5)
        toks = [rng.randrange(2) for _ in range(rng.randrange(0, 8))]
        toks += [rng.randrange(2) for _ in range(period)] * rng.randrange(0, 6)
        assert detect_loop(toks, max_period=6, span=8) == brute(toks, 6, 8), toks


def test_windows() -> None:
    assert windows(600, 256) == [(0, 256), (256, 512)]
    assert windows(2048, 256) == [(i * 256, (i + 1) * 256) for i in range(8)]
    assert windows(512, 256) == [(0, 256), (256, 512)]
    assert windows(255, 256) == [] and windows(0, 256) == []
    with pytest.raises(ValueError):
        windows(100, 0)
    with pytest.raises(ValueError):
        windows(-1, 10)
