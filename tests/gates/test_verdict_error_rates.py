"""Issue 29's acceptance test, on the fake model of tests/gates/fakes.py (closed-form logits, fast
enough for CI): the shipped checks/fp8_kvfp16.yaml's gate 1 and gate 3 — its limits as shipped, sized
ones sized from the fake reference's own spread, the loop rule — through the real gates and verdict,
over 20 seeds. A noisy-but-healthy candidate (the reference with Gaussian noise on every logit, its
own draw per seed) is approved in at least 19 of 20 seeds; a damaged one (the same noise, and a seeded
fifth of its positions predicting a wrong token, a generation that goes off the rails) is rejected in
at least 19 of 20.

The fake reaches gates 1 and 3 only (the others read natural text through a real tokenizer); the
real model's rates are measured by benchmarks/error_rates.py (benchmarks/RESULTS.md, "The verdict's own error rates").
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from qval.config import load_config, parse_config
from qval.gates import GATES
from qval.gates.base import GateContext
from qval import judges

from .fakes import HIGH, LOW, V, FakeEngine, FakeTokenizer, walk

ROOT = Path(__file__).resolve().parents[2]
SEEDS = range(20)
MAX_POS = 160


class Noisy(FakeEngine):
    """The reference's rows with N(0, sigma²) added to every logit and, with probability `wrong`,
    the peak moved to another token; the draw is a fixed table per seed, so scoring and greedy
    decoding see the same model."""

    def __init__(self, seed: int, sigma: float, wrong: float = 0.0) -> None:
        super().__init__(walk)
        g = torch.Generator().manual_seed(seed)
        self.noise = torch.randn(V, MAX_POS, V, generator=g) * sigma
        self.moved = torch.rand(V, MAX_POS, generator=g) < wrong

    def _row(self, token: int, pos: int) -> torch.Tensor:
        row = torch.full((V,), LOW)
        target = walk(token, pos)
        row[(target + 7) % 60 if self.moved[token, pos] else target] = HIGH
        return row + self.noise[token, pos]


def check_file(tmp_path: Path):  # noqa: ANN201 - the shipped check's gates 1 and 3 on the fake's data
    shipped = load_config(ROOT / "checks/fp8_kvfp16.yaml").model_dump(mode="json", exclude={"source_file"})
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": "".join(chr(97 + (i * 7 + k) % 26) for k in range(300))}) + "\n"
                            for i in range(4)), encoding="utf-8")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "".join(chr(97 + (i * 5 + k) % 26) for k in range(8))}) + "\n"
                               for i in range(8)), encoding="utf-8")
    gates = shipped["gates"]
    keep = {"agreement": {**gates["agreement"], "dataset": str(text), "tokens": 512, "ctx": 128},
            "longgen": {**gates["longgen"], "prompts": str(prompts), "new_tokens": 96, "window": 32, "edge": 32, "piece": 48}}
    off = {name: {"enabled": False} for name in gates if name not in keep}
    return parse_config({**shipped, "gates": {**keep, **off}}, str(tmp_path / "fp8_kvfp16.yaml"))


def verdict(cfg, candidate: FakeEngine, folder: Path):  # noqa: ANN001, ANN201
    results = {}
    for spec in GATES.ordered():
        if spec.enabled(cfg):
            ctx = GateContext(config=cfg, reference=FakeEngine(walk), candidate=candidate, tokenizer=FakeTokenizer(),
                              folder=folder / spec.name,
                              upstream=dict(results))
            ctx.folder.mkdir(parents=True, exist_ok=True)
            results[spec.name] = spec.run(ctx)
    return judges.verdict(cfg, results)


def test_the_check_file_approves_noisy_healthy_candidates_and_rejects_damaged_ones(tmp_path: Path) -> None:
    cfg = check_file(tmp_path)
    assert [s.name for s in GATES.ordered() if s.enabled(cfg)] == ["agreement", "longgen"]
    healthy = [verdict(cfg, Noisy(s, sigma=0.5), tmp_path / f"h{s}") for s in SEEDS]
    damaged = [verdict(cfg, Noisy(s, sigma=0.5, wrong=0.2), tmp_path / f"d{s}") for s in SEEDS]
    approved = sum(v.approved for v in healthy)
    rejected = sum(not v.approved for v in damaged)
    why = {f"{c.gate}/{c.metric}: {c.reason}" for v in healthy for c in v.failures}
    assert approved >= 19, f"healthy approved in {approved} of 20 seeds: {sorted(why)[:5]}"
    assert rejected >= 19, f"damaged rejected in {rejected} of 20 seeds"
    # the noise is real: every healthy seed measures a KLD of its own, none of them zero
    klds = {round(next(c.value for c in v.checks if c.metric == "mean_kld"), 9) for v in healthy}
    assert len(klds) == 20 and min(klds) > 0
    # damage is caught where it shows: gate 1 on natural positions, gate 3 on the derailed text
    failed = {f"{c.gate}/{c.metric}" for v in damaged for c in v.failures}
    assert {"agreement/top1", "agreement/mean_kld"} <= failed and any(f.startswith("longgen/") for f in failed)
