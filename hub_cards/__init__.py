"""Model cards generated from structured metadata (as timm's `_hub.py` does), never handwritten.

`write_card(CardMetadata(...), folder)` renders README.md with YAML front matter (library_name, license, tags,
datasets, pipeline_tag, base_model, model-index), the method and its citation, how to load the checkpoint with
`trust_remote_code=True`, training data and hyperparameters, the loss curve and other training figures, evaluation
results, intended use and limitations, and the encoder code a HIRE or BERTAC folder carries (`carried_backbone_code`:
its files, source and licence). `add_eval_results(folder, ...)` merges new results into an existing card's model-index
and results table.
"""

from encoder_zoo.hub_cards.card import add_eval_results, render_card, write_card
from encoder_zoo.hub_cards.metadata import CardMetadata, display_name, seeds_label
from encoder_zoo.hub_cards.papers import Paper
from encoder_zoo.hub_cards.plots import plot_loss_curve
from encoder_zoo.hub_cards.provenance import carried_backbone_code

__all__ = ["CardMetadata", "Paper", "add_eval_results", "carried_backbone_code", "display_name", "plot_loss_curve",
           "render_card", "seeds_label", "write_card"]
