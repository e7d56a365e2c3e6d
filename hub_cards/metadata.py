"""The structured facts a model card is generated from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class CardMetadata:
    """Everything a card says, as data.

    `paper` is any object with `title`, `authors`, `year`, `url`, `bibtex` (e.g. `training.recipes.Paper`).
    `optimisation` maps a setting to (the value this run used, the recipe's), shown side by side;
    `optimisation_reference` heads the recipe's column ("paper", or "tiny recipe" for the size no paper trains) and
    `optimisation_source` names where its values come from.
    `eval_results` holds dicts with the keyword arguments of `add_eval_results`.
    `starting_weights` (continued pretraining, `pretrain.py --init_from`) says which parameters were loaded from the
    starting checkpoint and which are new, as a short Markdown table.
    `carried_code` lists the code of other models the folder carries (HIRE's or BERTAC's remote-code encoder), each
    as `provenance.carried_backbone_code` describes it: files, classes, source, its `auto_map` and licence.
    Nothing here may hold an absolute local path: the folder is meant for the Hub.
    """

    model_name: str
    summary: str
    auto_map: dict[str, str]
    repo_id: str | None = None  # the Hub id; None writes a placeholder, never a local path
    license: str = "apache-2.0"
    tags: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    pipeline_tag: str | None = None
    base_model: str | None = None
    peft_target_modules: list[str] | None = None  # LoRA's attention projections (PEFT has no default for them)
    paper: Any = None
    architecture: dict[str, Any] = field(default_factory=dict)
    training_data: str = ""
    training: dict[str, Any] = field(default_factory=dict)
    optimisation: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    optimisation_reference: str = "paper"
    optimisation_source: str = ""
    paper_hyperparameters: dict[str, Any] = field(default_factory=dict)
    loss_curve: str | None = None
    figures: list[tuple[str, str]] = field(default_factory=list)
    eval_results: list[dict[str, Any]] = field(default_factory=list)
    intended_use: str = (
        "A research checkpoint for studying pretraining objectives: fine-tune it (e.g. with this project's "
        "`glue/run_glue.py` or `qa/run_qa.py`) before using its predictions."
    )
    limitations: list[str] = field(default_factory=list)
    carried_code: list[dict[str, Any]] = field(default_factory=list)
    starting_weights: str = ""  # continued pretraining: which parameters came from where (Markdown)


def display_name(path_or_id: str) -> str:
    """A name a card may record: a Hub id as is, a local folder by its last two parts (no absolute local path)."""
    path = Path(path_or_id).expanduser()
    return "/".join(path.resolve().parts[-2:]) if path.exists() else path_or_id


def seeds_label(seeds: list[int] | None) -> str:
    """How many runs a number summarises, for the metric's pretty name: "seed 1" or "median of 3 seeds: 1, 2, 3"."""
    if not seeds:
        return ""
    if len(seeds) == 1:
        return f"1 seed: {seeds[0]}"
    return f"median of {len(seeds)} seeds: {', '.join(map(str, seeds))}"
