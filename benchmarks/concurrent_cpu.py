"""Two models on one CPU: in turn with every thread, or side by side with a share each.

Decoding (8 prompts × NEW tokens, batch 8) and a prefill (1,024 tokens through the KV cache in
pieces of 256) of the built-in model and a copy of it, timed one model with all threads, one with
a share, two in turn and two side by side (qval/engines/concurrent.py), and whether the numbers
agree. Stop other heavy processes first: two processes on two cores distort every figure.

    python benchmarks/concurrent_cpu.py [NEW]
"""

from __future__ import annotations

import copy
import sys
import time

import torch

from qval.config import load_config
from qval.engines.concurrent import side_by_side
from qval.engines.hf import HFEngine
from qval.models import load_model


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return time.perf_counter() - t0, out


def main() -> None:
    new = int(sys.argv[1]) if len(sys.argv) > 1 else 96
    lm = load_model(load_config("checks/fp8_kvfp16.yaml").model)
    a, b = HFEngine(lm.model, lm.tokenizer), HFEngine(copy.deepcopy(lm.model), lm.tokenizer)
    total = torch.get_num_threads()
    ids = torch.randint(0, int(lm.model.config.vocab_size), (1, 1024), generator=torch.Generator().manual_seed(0))
    prompts = [lm.tokenizer(f"Tell me a story about number {i}.")["input_ids"] for i in range(8)]

    def prefill(e):
        return [x.sum().item() for x in e.logits_pieces(ids, 256)]

    def decode(e):
        return e.generate(prompts, new, suppress_eos=True, batch_size=8).tokens

    for name, job in (("prefill 1,024 tokens", prefill), (f"decode 8 × {new} tokens", decode)):
        t_all, r_all = timed(lambda: job(a))
        torch.set_num_threads(max(1, total // 2))
        t_share, r_share = timed(lambda: job(a))
        torch.set_num_threads(total)
        t_pair, (r_pair, paired) = timed(lambda: side_by_side([lambda: job(a), lambda: job(b)], [a, b]))
        print(f"{name}: one model, {total} threads {t_all:.2f} s; one model, {max(1, total // 2)} thread(s) {t_share:.2f} s; "
              f"two in turn ({total} threads) {2 * t_all:.2f} s; two side by side {t_pair:.2f} s (paired: {paired}); "
              f"side by side = alone with the same threads: {r_pair[0] == r_share and r_pair[1] == r_share}; "
              f"= {total} threads: {r_share == r_all}")


if __name__ == "__main__":
    main()
