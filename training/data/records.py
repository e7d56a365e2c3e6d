"""JSON records the zoo writes beside its data and runs (a pre-tokenized folder's record, a tokenizer's inputs, a
config), read back whole or refused in one line."""

from __future__ import annotations

from pathlib import Path


def read_json_record(path: Path, fix: str) -> dict:
    """A JSON object the zoo wrote (a config, a record), or one line naming the file, what is wrong and `fix`."""
    import json

    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); {fix}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} is not a JSON object (a {type(record).__name__}); {fix}")
    return record
