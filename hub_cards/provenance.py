"""Where the code of another model that a checkpoint carries came from, for its card.

HIRE and BERTAC over a remote-code encoder (a zoo export, or any `trust_remote_code` model) save that encoder's
modeling files next to their own (`save_backbone_code`), so the folder loads anywhere. Whoever uses the folder then
runs that code: the card names the files, the encoder they came from and its licence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from encoder_zoo.hub_cards.metadata import display_name

UNKNOWN_LICENSE = "unknown: check the backbone's licence"


def backbone_license(source: str) -> str:
    """The licence in the encoder's model card metadata (its README.md, in the folder or on the Hub), or
    `UNKNOWN_LICENSE` when it has none or the card cannot be read (offline, no card)."""
    from huggingface_hub import ModelCard

    readme = Path(source).expanduser() / "README.md"
    try:
        card = ModelCard.load(readme if readme.is_file() else source)
    except Exception:  # noqa: BLE001 (no card, offline, a folder without README.md: the licence is unknown)
        return UNKNOWN_LICENSE
    license_id = getattr(card.data, "license", None)
    if not license_id:
        return UNKNOWN_LICENSE
    named = [getattr(card.data, key, None) for key in ("license_name", "license_link")]
    extra = ", ".join(str(value) for value in named if value)
    return f"{license_id}{f' ({extra})' if extra else ''}, from the backbone's model card"


def backbone_auto_map(source: str) -> dict[str, str]:
    """The `auto_map` of the encoder's config.json: which of its files define which Auto class."""
    from transformers import PreTrainedConfig

    try:
        return dict(PreTrainedConfig.get_config_dict(source)[0].get("auto_map") or {})
    except Exception:  # noqa: BLE001 (the folder was readable when the model was built; say nothing rather than fail)
        return {}


def carried_backbone_code(backbone, source: str, files: list[str]) -> dict[str, Any] | None:
    """The card's entry for the encoder code a checkpoint carries (`files`, as `save_backbone_code` copies them), or
    None when it carries none (an encoder built into transformers). `backbone` is the encoder module, `source` the
    path or Hub id it was loaded from."""
    if not files:
        return None
    config_class, model_class = type(backbone.config), type(backbone)
    return {
        "files": sorted(files),
        "classes": f"{config_class.__name__}, {model_class.__name__} (model type `{config_class.model_type}`)",
        "module": model_class.__module__,
        "source": display_name(source),
        "auto_map": backbone_auto_map(source),
        "license": backbone_license(source),
    }
