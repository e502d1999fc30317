"""Shared by the reliability tests: run the CLI in-process and insist on a clean exit-2 error,
and a toy reference (tests/diagnostics/toy.py behind a byte tokenizer) that calibrates in a second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from qval.cli import app

runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    """(exit code, stdout + stderr) of `qval ARGS`."""
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def clean_error(*args: str) -> str:
    """`qval ARGS` must fail with exit 2, one `qval: error:` message and no traceback; returns the output."""
    code, out = cli(*args)
    assert code == 2, f"exit {code}, not 2:\n{out}"
    assert "qval: error:" in out and "Traceback" not in out, out
    return out


class ByteTokenizer:
    """Just what calibration needs of a tokenizer: bytes mod the toy vocabulary, an EOS id."""

    eos_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        from tests.diagnostics.toy import VOCAB

        return {"input_ids": [1 + b % (VOCAB - 1) for b in text.encode("utf-8")]}


def toy_reference() -> Any:
    from qval.models import LoadedModel
    from tests.diagnostics.toy import ToyLM

    return LoadedModel(model=ToyLM().eval(), tokenizer=ByteTokenizer(), name="toy", fingerprint="toy", device="cpu",
                       requested_dtype="float32", compute_dtype="float32")


def tiny_calibration(tmp_path: Path) -> dict[str, Any]:
    """A calibration section that reads a few KB: 2 samples of 64 byte-tokens."""
    data = tmp_path / "calib.jsonl"
    data.write_text("".join(f'{{"text": "calibration text number {i}, long enough to fill a window of tokens."}}\n'
                            for i in range(8)), encoding="utf-8")
    return {"dataset": str(data), "samples": 2, "seq_len": 64, "batch_size": 2}


WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu the pass code for locker is question "
         "what answer with number only amber wren").split()


def word_text(n: int, offset: int = 0) -> str:
    """`n` words of the tiny model's vocabulary: exactly `n` tokens for word_model_folder's tokenizer."""
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(n))


def word_model_folder(folder: Path, max_positions: int = 4096) -> Path:
    """A model folder the preflight can read in a second: a config.json with `max_positions` and a
    word-level tokenizer (one token per word of WORDS, digits one each, "</s>" the EOS). No weights:
    a command that got as far as loading this model fails, which is what the tests need."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *WORDS, *"0123456789", ".", "?", ":", ","])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)])
    folder.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>").save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                    "vocab_size": len(vocab), "max_position_embeddings": max_positions}))
    return folder


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    import json

    path.write_text("".join(json.dumps({field: t}) + "\n" for t in texts), encoding="utf-8")
    return path


def word_config(tmp_path: Path, *, calib_words: int = 4000, agreement_words: int = 2000, **sections: Any) -> dict[str, Any]:
    """A config on word_model_folder: calibration 4 × 128 tokens, gate 1 1024 tokens in chunks of 128,
    both data sets big enough; `sections` replace or extend the config's top-level sections."""
    model = word_model_folder(tmp_path / "model")
    cfg: dict[str, Any] = {
        "name": "words",
        "model": {"source": "path", "path": str(model)},
        "quant": {"format": "fp8", "kv_cache": "fp16"},
        "calibration": {"dataset": str(write_jsonl(tmp_path / "calib.jsonl", [word_text(calib_words)])), "samples": 4,
                        "seq_len": 128, "batch_size": 2},
        "gates": {"agreement": {"dataset": str(write_jsonl(tmp_path / "heldout.jsonl", [word_text(agreement_words, 7)])),
                                "tokens": 1024, "ctx": 128, "min_top1": 0.5}},
    }
    for k, v in sections.items():
        cfg[k] = {**cfg[k], **v} if isinstance(cfg.get(k), dict) and isinstance(v, dict) else v
    return cfg
