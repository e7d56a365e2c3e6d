"""Export a pretrained model as a Hub-ready folder: config with auto_map, modeling code, safetensors, tokenizer,
loss curve and a generated model card; optionally upload it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hub_cards import CardMetadata, plot_loss_curve, write_card

from .recipes import Recipe

ARCHITECTURE_KEYS = (
    "vocab_size", "hidden_size", "embedding_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings", "hidden_act", "word_embedding_dim", "filter_windows", "num_filters",
)


def export_pretrained(
    model,
    tokenizer,
    recipe: Recipe,
    export_dir: str | Path,
    *,
    model_size: str,
    training: dict[str, Any],
    training_data: str,
    datasets: list[str],
    log_history: list[dict[str, Any]],
    repo_id: str | None = None,
) -> Path:
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(export_dir)
    tokenizer.save_pretrained(export_dir)
    (export_dir / "training_log.json").write_text(json.dumps(log_history, indent=1))
    curve = plot_loss_curve(
        log_history, export_dir / "loss_curve.png", keys=("loss", *(k for k in recipe.logged_outputs if k.endswith("_loss")))
    )
    figures = []
    for file, keys in recipe.card_plots.items():
        caption = ", ".join(keys)
        if plot_loss_curve(log_history, export_dir / file, keys=keys, ylabel=caption):
            figures.append((caption, file))
    config = model.config
    architecture = {key: getattr(config, key) for key in ARCHITECTURE_KEYS if hasattr(config, key)}
    architecture["parameters"] = f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M"
    architecture.update({key: value for key, value in recipe.config_overrides.items()})
    meta = CardMetadata(
        model_name=repo_id.split("/")[-1] if repo_id else f"{recipe.name}-{model_size}",
        repo_id=repo_id or str(export_dir),
        summary=f"{recipe.summary} Size preset `{model_size}`, pretrained with this project's "
        f"`training/pretrain.py --model {recipe.name}`.",
        auto_map=dict(getattr(config, "auto_map", {}) or {}),
        tags=[recipe.family, recipe.name, "fill-mask" if "AutoModelForMaskedLM" in (config.auto_map or {}) else "feature-extraction"],
        datasets=datasets,
        pipeline_tag="feature-extraction",
        paper=recipe.paper,
        architecture=architecture,
        training_data=training_data,
        training=training,
        paper_hyperparameters=recipe.hyperparameters,
        loss_curve=curve.name if curve else None,
        figures=figures,
        limitations=[
            f"Size `{model_size}` trained for {training.get('steps', '?')} steps: far less compute than the paper; "
            "expect much weaker downstream results than published numbers.",
            "English only; inherits the biases of its pretraining text.",
        ],
    )
    write_card(meta, export_dir)
    return export_dir


def push_export(export_dir: str | Path, repo_id: str, token: str | None = None, private: bool | None = None) -> str:
    """Upload an export folder to the Hub (needs network access and a write token)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, exist_ok=True, private=private)
    commit = api.upload_folder(folder_path=str(export_dir), repo_id=repo_id, commit_message="Upload pretrained checkpoint")
    return str(commit)
