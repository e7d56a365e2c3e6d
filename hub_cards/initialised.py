"""The card of a model built over a pretrained encoder and not fine-tuned yet (`glue/init_hire.py`,
`glue/init_bertac.py`)."""

from __future__ import annotations

from pathlib import Path

from encoder_zoo.hub_cards.card import write_card
from encoder_zoo.hub_cards.metadata import CardMetadata, display_name
from encoder_zoo.hub_cards.provenance import backbone_license, carried_backbone_code


def write_initialised_card(model, encoder, backbone: str, code_files, output: Path, *, architecture: dict,
                           **fields) -> Path:
    """README.md in `output` for `model`, whose `encoder` was loaded from `backbone`: the card's name is the folder's,
    the encoder and the head lead `architecture`, and the auto_map, the base model (a Hub backbone; a local one is
    named in the text only), the fine-tuning (none yet) and the encoder code the folder carries (`code_files`, its
    files there) come from the model. `fields`: the other `CardMetadata` fields (summary, tags, paper, ...)."""
    from encoder_zoo.training.data.resources import hub_origin

    config = model.config
    encoder_config = config.backbone_config
    carried = carried_backbone_code(encoder, backbone, list(code_files))
    origin = hub_origin(backbone)  # the shipped MiniLM: its Hub id and licence, not a local path
    name = f"{origin[0]} (the copy shipped on PyPI)" if origin else display_name(backbone)
    meta = CardMetadata(
        model_name=output.resolve().name,
        auto_map=dict(config.auto_map or {}),
        base_model=origin[0] if origin else backbone if not Path(backbone).expanduser().exists() else None,
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
