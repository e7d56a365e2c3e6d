"""The card of a model built over a pretrained encoder and not fine-tuned yet (`glue/init_hire.py`,
`glue/init_bertac.py`)."""

from __future__ import annotations

from pathlib import Path

from encoder_zoo.hub_cards.card import write_card
from encoder_zoo.hub_cards.metadata import CardMetadata, display_name
from encoder_zoo.hub_cards.origins import hub_origin
from encoder_zoo.hub_cards.provenance import backbone_license, carried_backbone_code


def write_initialised_card(model, encoder, backbone: str, code_files, output: Path, *, architecture: dict,
                           **fields) -> Path:
    """README.md in `output` for `model`, whose `encoder` was loaded from `backbone`: the card's name is the folder's,
    the encoder and the head lead `architecture`, and the auto_map, the base model (a Hub backbone; a local one is
    named in the text only), the fine-tuning (none yet) and the encoder code the folder carries (`code_files`, its
    files there) come from the model. `fields`: the other `CardMetadata` fields (summary, tags, paper, ...)."""
    config = model.config
    encoder_config = config.backbone_config
    carried = carried_backbone_code(encoder, backbone, list(code_files))
    origin = hub_origin(backbone)  # the shipped MiniLM: its Hub id and licence, not a local path
    continues = None if origin else continued_hub_origin(backbone)  # a zoo export of continued pretraining
    name = (f"{origin[0]} (the copy shipped on PyPI)" if origin else display_name(backbone)
            + (f" (continued pretraining of {continues})" if continues else ""))
    meta = CardMetadata(
        model_name=output.resolve().name,
        auto_map=dict(config.auto_map or {}),
        base_model=(origin[0] if origin else continues if continues
                    else backbone if not Path(backbone).expanduser().exists() else None),
        architecture={
            "encoder": f"{name} ({encoder_config.model_type}, {encoder_config.num_hidden_layers} "
                       f"layers, width {encoder_config.hidden_size})",
            "encoder weights' licence": (f"{origin[1]}, from the card of {origin[0]}" if origin
                                         else backbone_license(backbone)),
            "head": type(model).__name__,
            **architecture,
        },
        training={"fine-tuning": "none yet"},
        carried_code=[carried] if carried else [],
        **fields,
    )
    return write_card(meta, output)


def continued_hub_origin(backbone: str) -> str | None:
    """The first Hub origin a zoo export of continued pretraining records (its init_from.json's `base_model`), so a
    model built over it keeps the lineage; None for anything else."""
    import json

    try:
        record = json.loads((Path(backbone).expanduser() / "init_from.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record.get("base_model") if isinstance(record, dict) else None
