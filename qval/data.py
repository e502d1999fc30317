"""Datasets: local JSONL / text / parquet files, or `datasets` names when a hub is reachable.

A dataset spec is a path (`calib_data/general_mix.jsonl`, `notes.txt`, `val.parquet`) or
`hf:NAME[:CONFIG][@SPLIT]` (for example `hf:wikitext:wikitext-2-raw-v1@test`).
Records are dicts; text comes from the first of the fields `text`, `content`, `document`,
or from `messages` (a chat, rendered one turn per line).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .errors import DataError
from .io import file_fingerprint, hash_json, read_text_utf8

TEXT_FIELDS = ("text", "content", "document")


@dataclass(frozen=True)
class Dataset:
    spec: str
    records: list[dict[str, Any]]
    fingerprint: str

    def texts(self) -> list[str]:
        return [record_text(r, self.spec, i) for i, r in enumerate(self.records)]


def missing_message(spec: str, looked_at: Path) -> str:
    where = "" if str(looked_at) == spec else f" (looked at {looked_at})"
    what = "is a folder, not a file" if Path(looked_at).is_dir() else "no such file"
    return f"{spec}: {what}{where}. Give a JSONL, .txt or .parquet file, or hf:NAME[:CONFIG][@SPLIT]."


def record_text(record: dict[str, Any], spec: str, index: int) -> str:
    for key in TEXT_FIELDS:
        if isinstance(record.get(key), str):
            return record[key]
    if isinstance(record.get("messages"), list):
        return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in record["messages"])
    raise DataError(
        f"{spec}: record {index} has no text; give a string field named one of {', '.join(TEXT_FIELDS)} "
        f"or a 'messages' list. Its keys: {', '.join(record) or '(none)'}."
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(read_text_utf8(path, DataError).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{n}: not valid JSON ({err.msg} at column {err.colno}); each line must be one JSON object.") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{n}: each line must be a JSON object, not {type(obj).__name__}.")
        out.append(obj)
    return out


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow comes with datasets
        raise DataError(f"{path}: reading parquet needs pyarrow; `pip install pyarrow`.") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises its own ArrowInvalid / OSError types for a damaged file
        raise DataError(f"{path}: not a readable parquet file ({type(err).__name__}: {err}); write it again or use JSONL.") from None


def _read_hub(spec: str) -> list[dict[str, Any]]:
    body = spec.removeprefix("hf:")
    body, _, split = body.partition("@")
    name, _, config = body.partition(":")
    try:
        import datasets
    except ImportError:  # pragma: no cover
        raise DataError(f"{spec}: hub datasets need the `datasets` package.") from None
    try:
        ds = datasets.load_dataset(name, config or None, split=split or "test")
    except Exception as err:  # datasets raises many types for offline/missing
        raise DataError(
            f"{spec}: cannot load dataset {name!r} (config {config or 'default'}, split {split or 'test'}): "
            f"{type(err).__name__}: {err}. Without a hub, use a local JSONL/text/parquet file."
        ) from None
    return [dict(r) for r in ds]


def load_dataset(spec: str, resolved: Path | None = None) -> Dataset:
    """Read a dataset spec into records. `resolved` is the path after config-relative lookup."""
    if spec.startswith("hf:"):
        records = _read_hub(spec)
        fingerprint = hash_json(records)
    else:
        path = resolved or Path(spec)
        if not path.is_file():
            raise DataError(missing_message(spec, path))
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            records = _read_jsonl(path)
        elif suffix == ".parquet":
            records = _read_parquet(path)
        elif suffix in (".txt", ".md", ".text"):
            # blank-line separated documents
            chunks = [c.strip() for c in read_text_utf8(path, DataError).split("\n\n")]
            records = [{"text": c} for c in chunks if c]
        else:
            raise DataError(f"{spec}: unknown file type {suffix!r}; use .jsonl, .txt or .parquet.")
        fingerprint = file_fingerprint(path, full=True)
    if not records:
        raise DataError(f"{spec}: the dataset is empty.")
    return Dataset(spec=spec, records=records, fingerprint=fingerprint)


def read_texts(spec: str, resolved: Path | None = None) -> list[str]:
    """Every record's text, or a DataError: the file is missing, not UTF-8, a line is not JSON,
    a record has no text field, or there is no text at all (only blank records)."""
    ds = load_dataset(spec, resolved)
    texts = ds.texts()
    if not any(t.strip() for t in texts):
        raise DataError(f"{spec}: its {len(texts)} records hold no text (every text field is empty).")
    return texts


def token_stream(texts: Iterable[str], tokenizer: Any, separator: int | None) -> list[int]:
    """Tokenize documents and join them, `separator` (usually EOS) between documents."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if separator is not None:
            ids.append(separator)
    return ids


def chunk(ids: list[int], size: int, limit: int | None = None) -> list[list[int]]:
    """Disjoint chunks of exactly `size` tokens; the remainder is dropped.

    >>> chunk(list(range(7)), 3)
    [[0, 1, 2], [3, 4, 5]]
    """
    n = len(ids) // size
    if limit is not None:
        n = min(n, limit)
    return [ids[i * size : (i + 1) * size] for i in range(n)]


def dataset_identity(spec: str, resolved: Path) -> dict[str, str]:
    """What a stage key needs to know about a dataset: its spec and its content hash
    (a hub dataset is identified by its name; its content is hashed when it is read)."""
    if spec.startswith("hf:"):
        return {"spec": spec, "fingerprint": spec}
    if not resolved.is_file():
        raise DataError(missing_message(spec, resolved))
    return {"spec": spec, "fingerprint": file_fingerprint(resolved, full=True)}
