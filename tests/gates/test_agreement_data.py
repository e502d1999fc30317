"""Gate 1 reads only as much of its data set as it scores, and cuts the same chunks as from the
whole set; its positions file is a plain .npz that gate 2 reads back."""

from __future__ import annotations

import zipfile

import numpy as np

from qval.data import chunk, token_stream
from qval.gates.agreement.run import leading_tokens
from qval.gates.base import save_positions


class CharTokenizer:
    """One token per character (its code point): token counts worked by hand."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def test_leading_tokens_stops_after_the_document_that_fills_the_budget():
    texts = ["abcd", "efg", "hijklm", "no"]  # 4+1, 3+1, 6+1, 2+1 tokens with a separator after each
    ids, more = leading_tokens(texts, CharTokenizer(), 0, budget=8)
    assert ids == [97, 98, 99, 100, 0, 101, 102, 103, 0] and more  # 9 ≥ 8 after two documents
    ids, more = leading_tokens(texts, CharTokenizer(), 0, budget=100)
    assert ids == token_stream(texts, CharTokenizer(), 0) and not more


def test_leading_tokens_give_the_chunks_of_the_whole_set():
    texts = [("lorem ipsum dolor " * (i + 1))[: 7 + 5 * i] for i in range(20)]
    full = token_stream(texts, CharTokenizer(), 0)
    for ctx, tokens in ((8, 40), (16, 64), (32, 10_000)):
        ids, _ = leading_tokens(texts, CharTokenizer(), 0, tokens // ctx * ctx)
        assert chunk(ids, ctx, limit=tokens // ctx) == chunk(full, ctx, limit=tokens // ctx)


def test_positions_file_round_trips(tmp_path):
    arrays = {"kld": np.array([0.0, 0.5, np.nan]), "top1": np.array([True, False, True])}
    save_positions(tmp_path, arrays)
    with np.load(tmp_path / "positions.npz") as z:
        assert np.array_equal(z["kld"], arrays["kld"], equal_nan=True) and z["top1"].tolist() == [True, False, True]
    with zipfile.ZipFile(tmp_path / "positions.npz") as z:  # stored, not deflated (see save_positions)
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}


class TableEngine:
    """Logits = a fixed random row per (token, position): deterministic, any batch size."""

    def __init__(self, seed: int, nan_at: tuple[int, int] | None = None) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(128, 16, 128, generator=g)  # token × position × vocab (ids are ASCII codes)
        self.nan_at = nan_at
        self.seen = 0  # chunks scored so far, to plant the NaN in one chunk only

    device = "cpu"

    def logits(self, input_ids):
        import torch

        out = torch.stack([self.table[row, torch.arange(row.shape[0])] for row in input_ids])
        if self.nan_at is not None:
            c, t = self.nan_at
            if self.seen <= c < self.seen + len(input_ids):
                out[c - self.seen, t, 3] = float("nan")
        self.seen += len(input_ids)
        return out


def _gate_ctx(tmp_path, ref, cand, ctx_len=16, tokens=80, batch=3):
    from qval.config import parse_config
    from qval.gates.base import GateContext

    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"text": "{"qwertyuiopasdfghjkl"[i % 7 :] * 3}"}}\n' for i in range(12)), encoding="utf-8")
    cfg = parse_config({"name": "t", "quant": {"format": "none"},
                        "gates": {"agreement": {"dataset": str(data), "tokens": tokens, "ctx": ctx_len, "batch_size": batch,
                                                "max_mean_kld": 1.0}}})
    tok = CharTokenizer()
    tok.eos_token_id = 0
    (tmp_path / "g").mkdir()
    return GateContext(config=cfg, reference=ref, candidate=cand, tokenizer=tok, folder=tmp_path / "g")


def test_batched_metrics_equal_the_per_chunk_metrics(tmp_path):
    """5 chunks in batches of 3 (a short last batch): every per-position figure equals
    token_stats run chunk by chunk, the way the gate computed them before batching."""
    import torch

    from qval.gates.agreement import run as agreement
    from qval.metrics.tokens import token_stats

    ctx = _gate_ctx(tmp_path, TableEngine(1), TableEngine(2))
    result = agreement.run(ctx)
    assert result.status == "ok" and result.details.chunks == 5
    with np.load(tmp_path / "g/positions.npz") as z:
        got = {f: z[f] for f in agreement.FIELDS}
    chunks, _ = agreement.scored_chunks(ctx)
    ref, cand = TableEngine(1), TableEngine(2)
    want: dict[str, list[np.ndarray]] = {f: [] for f in agreement.FIELDS}
    for c in chunks:
        x = torch.tensor([c])
        s = token_stats(ref.logits(x)[0, 8:-1], cand.logits(x)[0, 8:-1], x[0, 9:])
        for f in agreement.FIELDS:
            want[f].append(s[f].numpy())
    for f in agreement.FIELDS:
        assert np.array_equal(got[f], np.concatenate(want[f])), f
    assert got["kld"].size == 5 * 7  # 5 chunks × (16 − 8 − 1)


def test_a_nan_in_one_chunk_is_located_in_that_chunk(tmp_path):
    from qval.gates.agreement import run as agreement

    result = agreement.run(_gate_ctx(tmp_path, TableEngine(1), TableEngine(2, nan_at=(4, 11))))
    assert result.status == "nonfinite"
    # chunk 4 is the second of batch 2; position 11 is scored row 11 − 8 = 3 of it: 4·7 + 3 = 31
    assert "chunk 4, position 11 (scored position 31)" in result.error
