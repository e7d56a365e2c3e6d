"""Loading a model or tokenizer named on the command line, with one clear line when the name or the files are bad."""

from __future__ import annotations

import os
from pathlib import Path


def missing_local_path(name: str | None) -> bool:
    """True for a path-like name (./x, /x, ~/x, a/b/c) that does not exist; Hub ids are `name` or `org/name`."""
    if not name or Path(name).expanduser().exists():
        return False
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def check_model_path(name: str, flag: str = "--model_name_or_path") -> None:
    if Path(name).expanduser().is_file():
        raise FileNotFoundError(f"{flag} {name} is a file; pass a checkpoint folder or a Hub id.")
    if missing_local_path(name):
        raise FileNotFoundError(f"{flag} {name}: no such folder (nor a Hub id: those are NAME or ORG/NAME).")


def damaged_weights(name: str) -> str | None:
    """The first safetensors file of a local checkpoint folder that is empty, truncated or not safetensors."""
    folder = Path(name).expanduser()
    if not folder.is_dir():
        return None
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        if file.stat().st_size == 0:
            return f"{file} is empty"
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    handle.get_slice(key)  # reads each tensor's header entry: a truncated file fails here
        except Exception as error:  # safetensors raises its own error types
            return f"{file} is truncated or not a safetensors file ({str(error).splitlines()[0]})"
    return None


def load_pretrained(auto_class, name: str, flag: str = "--model_name_or_path", **kwargs):
    """`auto_class.from_pretrained(name, **kwargs)`; a missing folder or damaged weights get a message naming them."""
    check_model_path(name, flag)
    try:
        return auto_class.from_pretrained(name, **kwargs)
    except Exception:
        problem = damaged_weights(name)
        if problem:
            raise OSError(f"{flag} {name}: {problem}; re-export or re-download the checkpoint.") from None
        raise
