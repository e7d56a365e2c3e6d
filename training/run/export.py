"""Export a pretrained model as a Hub-ready folder: config with auto_map, modeling code, safetensors, tokenizer,
loss curve and a generated model card; optionally upload it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from encoder_zoo import models
from encoder_zoo.hub_cards import CardMetadata, plot_loss_curve, write_card
from encoder_zoo.training.run.describe import describe_optimizer, describe_schedule, describe_warmup
from encoder_zoo.training.run.elastic import global_batch

ARCHITECTURE_KEYS = (
    "vocab_size", "hidden_size", "embedding_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings", "hidden_act", "word_embedding_dim", "filter_windows", "num_filters",
)


def export_pretrained(
    model,
    tokenizer,
    recipe,  # a training.recipes.Recipe (the registry sits above this module)
    export_dir: str | Path,
    *,
    model_size: str,
    training: dict[str, Any],
    training_data: str,
    datasets: list[str],
    log_history: list[dict[str, Any]],
    optimisation: dict[str, tuple[str, str]] | None = None,
    repo_id: str | None = None,
    starting: dict[str, Any] | None = None,
) -> Path:
    """Save model, tokenizer, log, loss curve and card. `optimisation`: setting -> (this run, the recipe: the paper's,
    or this project's for `tiny`), from `optimisation_comparison`. `starting`: the `--init_from` record
    (`training.run.init_from.InitPlan.record`) of a run that continued published weights."""
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(export_dir)
    tokenizer.save_pretrained(export_dir)
    # Keys sorted, as trainer_state.json holds them: a resumed run's log (its first entries read back from its
    # checkpoint) is then written byte for byte as the uninterrupted run's, but for the timings.
    (export_dir / "training_log.json").write_text(json.dumps(log_history, indent=1, sort_keys=True))
    losses = [k for k in recipe.logged_outputs if k.endswith("_loss")]
    masked = "mlm_loss" in losses  # the held-out figures at [MASK]ed targets (`validation_rows`), drawn where logged
    curve = plot_loss_curve(log_history, export_dir / "loss_curve.png",
                            keys=("loss", "eval_loss", *losses, *(f"eval_{k}" for k in losses),
                                  *["eval_mlm_masked_loss"] * masked))
    figures = []
    accuracies = [k for k in recipe.logged_outputs if k.endswith("_accuracy")]
    accuracy_keys = (*accuracies, *(f"eval_{k}" for k in accuracies), *["eval_mlm_masked_accuracy"] * masked)
    if accuracy_keys and plot_loss_curve(log_history, export_dir / "accuracy.png", keys=accuracy_keys,
                                         ylabel="accuracy"):
        figures.append(("Training and validation accuracies", "accuracy.png"))
    for file, keys in recipe.card_plots.items():
        caption = ", ".join(keys)
        if plot_loss_curve(log_history, export_dir / file, keys=keys, ylabel=caption):
            figures.append((caption, file))
    config = model.config
    architecture = {key: getattr(config, key) for key in ARCHITECTURE_KEYS if hasattr(config, key)}
    architecture["parameters"] = parameter_count(sum(p.numel() for p in model.parameters()))
    architecture.update({key: value for key, value in recipe.config_overrides.items()})
    defaults = recipe.training_defaults[model_size]  # the recipe the card's optimisation table stands beside
    origin = starting_origin(starting, recipe, training) if starting else {}
    meta = CardMetadata(
        model_name=repo_id.split("/")[-1] if repo_id else origin.get("model_name", f"{recipe.name}-{model_size}"),
        repo_id=repo_id,  # None: a placeholder in the card, never the local path
        summary=f"{recipe.summary} " + origin.get("summary", f"Size preset `{model_size}`, pretrained with this "
                                                  f"project's `training/pretrain.py --model {recipe.name}`."),
        base_model=origin.get("base_model"),
        starting_weights=origin.get("section", ""),
        auto_map=dict(getattr(config, "auto_map", {}) or {}),
        peft_target_modules=models.PEFT_TARGET_MODULES.get(config.model_type),
        tags=[recipe.family, recipe.name,
              "fill-mask" if "AutoModelForMaskedLM" in (config.auto_map or {}) else "feature-extraction"],
        datasets=datasets,
        pipeline_tag="feature-extraction",
        paper=recipe.paper,
        architecture=architecture,
        training_data=training_data,
        training=training,
        optimisation=optimisation or {},
        optimisation_reference=defaults.reference,
        optimisation_source=f"{defaults.source}; {defaults.size} model" + origin.get("optimisation_note", ""),
        paper_hyperparameters=recipe.hyperparameters,
        loss_curve=curve.name if curve else None,
        figures=figures,
        limitations=[
            origin.get("limitation", f"Size `{model_size}` trained for {training.get('steps', '?')} steps: far less "
                       "compute than the paper; expect much weaker downstream results than published numbers."),
            "English only; inherits the biases of its pretraining text.",
        ],
    )
    write_card(meta, export_dir)
    return export_dir


def starting_origin(starting: dict[str, Any], recipe, training: dict[str, Any]) -> dict[str, str]:
    """What a card of continued pretraining says instead of a run from scratch's: its name, the sentence naming the
    starting weights and the steps added, the Hub's `base_model` (a Hub id only), and the load table."""
    main = starting["checkpoints"]["--init_from"]
    steps = training.get("steps", "?")
    others = "".join(f" and {flag} `{c['name']}`" for flag, c in starting["checkpoints"].items()
                     if flag != "--init_from")
    notes = "".join(f"\n- {note}" for note in starting.get("notes", []))
    # A continuation of a continuation (phase 2 after phase 1, TAPT after DAPT) keeps its first Hub origin.
    chain = starting.get("chain") or [main]
    base_model = starting.get("base_model", main.get("hub_id"))
    tokenizer = starting.get("tokenizer")
    what = f"its weights and architecture; the tokenizer `{tokenizer}`" if tokenizer else (
        "its weights, architecture and tokenizer")
    through = "".join(f", which continues `{start['name']}`" for start in reversed(chain[:-1]))
    return {
        "model_name": f"{recipe.name}-from-{_short_name(base_model or main['name'])}",
        "summary": f"Continued pretraining, not the paper's run from scratch: started from `{main['name']}`{through}"
                   f"{others} ({what}), then trained {steps} more steps with this "
                   f"objective by this project's `training/pretrain.py --model {recipe.name} --init_from`.",
        "base_model": base_model,
        "section": f"{starting['summary']}.{notes}\n\n{starting['table']}",
        "optimisation_note": "; the paper pretrains from random weights, this run continues published ones",
        "limitation": f"{steps} steps of continued pretraining on top of `{main['name']}`{through}: its strengths, "
                      "limits and biases carry over.",
    }


def _short_name(name: str) -> str:
    """A starting point's last name part for a model name: a Hub id's, a folder's, a fairseq file's folder's."""
    parts = name.rstrip("/").split("/")
    return parts[-2] if parts[-1].endswith(".pt") and len(parts) > 1 else parts[-1]


def lever_rows(args, training_args) -> dict[str, str]:
    """The card's row of the flags that changed how each step ran, not what it learnt (`pretrain.py`'s speed levers,
    docs/scaling.md): a reader comparing two cards, or rerunning one, sees them. `--unpad` also stays in the exported
    config (`unpad: true`), so the card says what that does to a user's forward."""
    used = []
    if getattr(args, "packing", False):
        used.append("`--packing` (each batch's examples concatenated into one row, no padding)")
    if getattr(args, "unpad", False):
        used.append("`--unpad` (the encoder ran on the real tokens only; config.json keeps `unpad: true`, so a padded "
                    "batch is unpadded inside the model, the same outputs: pass `unpad=False` to `from_pretrained` to "
                    "run it padded)")
    if getattr(args, "target_buffer", False):
        used.append("`--target_buffer` (masked targets in a fixed-size buffer per batch; the same losses)")
    if getattr(args, "attn_implementation", None):
        used.append(f"`--attn_implementation {args.attn_implementation}`")
    if getattr(training_args, "torch_compile", False):
        used.append("`--torch_compile`")
    return {"speed levers": "; ".join(used)} if used else {}


def parameter_count(count: int) -> str:
    """A parameter count with three significant digits: 41.2K, 1.61M, 110M, 1.3B (never "0.0M")."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return str(count)


def mean_logged_loss(log_history: list[dict[str, Any]], end_step: int) -> float | None:
    """The mean training loss over steps 1..`end_step` from the logged interval means (each weighted by the steps
    it covers); None unless the logs reach `end_step`. Also right for a resumed run, whose Trainer `train_loss` is
    the mean of its last session only: every checkpoint and the last step are logged (`trainer.LogAtCheckpoints`),
    so a resumed run's log holds the uninterrupted run's intervals."""
    logged = [(entry["step"], entry["loss"]) for entry in log_history if "loss" in entry and "step" in entry]
    if not logged or logged[-1][0] != end_step or end_step <= 0:
        return None
    total, previous = 0.0, 0
    for step, loss in logged:
        if step <= previous:
            return None
        total += loss * (step - previous)
        previous = step
    return total / end_step


def training_loss_rows(log_history: list[dict[str, Any]], mean_loss: float | None) -> dict[str, Any]:
    """The card's training-loss rows: the last logged value (with its step) and Trainer's `train_loss`, which is the
    mean over the whole run, each named for what it is."""
    rows = {}
    logged = [entry for entry in log_history if "loss" in entry and "step" in entry]
    if logged:
        rows[f"training loss, last logged (step {logged[-1]['step']})"] = round(logged[-1]["loss"], 4)
    if mean_loss is not None:
        rows["training loss, mean over the run"] = round(mean_loss, 4)
    return rows


def unigram_loss(train, held_out, size: int, special) -> tuple[float, int, int]:
    """The cross-entropy, in nats per token, of a unigram model of the `train` examples' tokens (counts plus one
    for every non-special token: Laplace) on every non-special token of the `held_out` examples, and the two token
    counts: what a model that learned only token frequencies scores at masked targets (`repro/floors.py` says why).
    `size`: the vocabulary; `special`: the special token ids, never counted."""
    import numpy as np

    def counts(examples) -> np.ndarray:
        total = np.zeros(size, dtype=np.float64)
        for batch in examples.iter(batch_size=2048):
            flat = np.fromiter((t for ids in batch["input_ids"] for t in ids), dtype=np.int64)
            total += np.bincount(flat, minlength=size)[:size]
        total[special] = 0
        return total

    trained, seen = counts(train), counts(held_out)
    law = trained + 1.0  # Laplace: a piece the training examples lack is not impossible
    law[special] = 0
    law /= law.sum()
    value = float(-(seen * np.log(np.where(seen > 0, law, 1.0))).sum() / seen.sum())
    return value, int(trained.sum()), int(seen.sum())


def add_unigram_floor(metrics: dict, log_history: list, train_dataset, eval_dataset, tokenizer) -> None:
    """Beside the held-out MLM loss at [MASK]ed targets, the unigram floor of the same tokens (`unigram_loss`), as
    `eval_unigram_floor` in `metrics` and in the log's last evaluation (training_log.json, the card, the finished
    line, the demo's summary); nothing for a run without that loss, held-out examples, or examples in memory (a
    stream)."""
    if ("eval_mlm_masked_loss" not in metrics or eval_dataset is None
            or "input_ids" not in (getattr(train_dataset, "column_names", None) or ())):
        return
    floor, _, _ = unigram_loss(train_dataset, eval_dataset, len(tokenizer), sorted(set(tokenizer.all_special_ids)))
    metrics["eval_unigram_floor"] = floor
    evaluation = next((e for e in reversed(log_history) if "eval_mlm_masked_loss" in e), None)
    if evaluation is not None:
        evaluation["eval_unigram_floor"] = floor


# What a held-out figure is, where its name alone would not say: an MLM's 80/10/10 mean includes targets left unchanged,
# which the model copies from its input; the masked-only figure (training.run.trainer.add_masked_only) is the headline.
HELD_OUT_NAMES = {
    "mlm_masked_loss": "MLM loss at [MASK]ed targets only, nats (the headline: tokens predicted unseen)",
    "mlm_masked_accuracy": "MLM top-1 accuracy at [MASK]ed targets only, points",
    "mlm_masked_targets": "[MASK]ed targets scored",
    "unigram_floor": "unigram floor at the same targets, nats (token frequencies alone: what the headline must beat)",
    "mlm_loss": "MLM loss over all 80/10/10 targets, nats (a tenth left unchanged: copied, not predicted)",
    "mlm_ppl": "MLM perplexity over all 80/10/10 targets",
    "mlm_accuracy": "MLM top-1 accuracy over all 80/10/10 targets, points",
    "cloze_loss": "cloze loss, nats (every token predicted from both sides without seeing it)",
    "cloze_ppl": "cloze perplexity (every token predicted without seeing it)",
    "bilm_loss": "bilm loss, nats (each tower's next token, unseen)",
}


def validation_rows(metrics: dict) -> dict:
    """The card's held-out rows: the masked-only MLM figures first where the run has them, then the total loss and
    each objective's loss, perplexity and accuracy, each named for what it averages (`HELD_OUT_NAMES`)."""
    headline = [name for name in ("mlm_masked_loss", "unigram_floor", "mlm_masked_accuracy", "mlm_masked_targets")
                if f"eval_{name}" in metrics]
    others = [key.removeprefix("eval_") for key in metrics if key.startswith("eval_") and key != "eval_loss"
              and key.endswith(("_loss", "_ppl", "_accuracy")) and key.removeprefix("eval_") not in headline]
    rows = {f"validation {HELD_OUT_NAMES[name]}": shown(name, metrics[f"eval_{name}"]) for name in headline}
    if "eval_loss" in metrics:
        rows["validation loss"] = round(metrics["eval_loss"], 4)
    rows.update({f"validation {HELD_OUT_NAMES.get(name, name + ', points' if name.endswith('_accuracy') else name)}":
                 shown(name, metrics[f"eval_{name}"]) for name in others})
    return rows


def shown(name: str, value):
    """A figure as the card shows it: an accuracy in points, as every score this project shows (Trainer's own logs,
    trainer_state.json and training_log.json, keep the fraction it logs)."""
    return round(100 * value, 2) if name.endswith("_accuracy") else value


def optimisation_comparison(trainer, paper, max_seq_length: int,
                            mlm_probability: float | None = None) -> dict[str, tuple[str, str]]:
    """What the run used, read from the trained `trainer` (its optimizer object, resolved arguments and decay
    groups), next to the paper's values. `mlm_probability`: the run's masking rate (None: the recipe masks nothing)."""
    args, state = trainer.args, trainer.state
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate wraps it
    names = [name for name, parameter in trainer.model.named_parameters() if parameter.requires_grad]
    decayed = set(trainer.get_decay_parameter_names(trainer.model)) & set(names)
    warmup = args.get_warmup_steps(state.max_steps)
    scheduler_kwargs = args.lr_scheduler_kwargs if isinstance(args.lr_scheduler_kwargs, dict) else {}
    examples_per_update = global_batch(args)
    rows = {
        "optimizer": (describe_optimizer(type(optimizer).__name__, optimizer.defaults),
                      describe_optimizer(paper.optim_class_name(), paper.optimizer_kwargs())),
        "peak learning rate": (f"{args.learning_rate:g}", f"{paper.learning_rate:g}"),
        "warmup": (describe_warmup(warmup, state.max_steps, scheduler_kwargs),
                   describe_warmup(paper.warmup_steps, paper.total_steps, paper.lr_scheduler_kwargs)),
        "decay": (describe_schedule(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type), scheduler_kwargs),
                  describe_schedule(paper.lr_scheduler_type, paper.lr_scheduler_kwargs)),
        "weight decay": (_decay_text(args.weight_decay, len(decayed) == len(names)),
                         _decay_text(paper.weight_decay, paper.decay_norms_and_biases)),
        "gradient clipping": (_clip_text(args.max_grad_norm), _clip_text(paper.max_grad_norm)),
        "batch (sequences per update)": (f"{examples_per_update}",
                                         f"{paper.batch_size}" if paper.batch_size else "not stated"),
        "sequence length": (f"{max_seq_length}", f"{paper.max_seq_length}"),
        "updates": (f"{state.global_step}", f"{paper.total_steps}"),
    }
    if mlm_probability is not None:
        rows["masking rate"] = (f"{mlm_probability:.0%}", f"{paper.mlm_probability or 0.15:.0%}")
    return rows


def _decay_text(weight_decay: float, every_parameter: bool) -> str:
    if not weight_decay:
        return "none"
    return f"{weight_decay:g}, " + ("every parameter" if every_parameter else "biases and LayerNorm exempt")


def _clip_text(max_grad_norm: float) -> str:
    return f"global norm {max_grad_norm:g}" if max_grad_norm and max_grad_norm > 0 else "none"


def push_export(export_dir: str | Path, repo_id: str, token: str | None = None, private: bool | None = None) -> str:
    """Upload an export folder to the Hub (needs network access and a write token)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, exist_ok=True, private=private)
    commit = api.upload_folder(folder_path=str(export_dir), repo_id=repo_id,
                               commit_message="Upload pretrained checkpoint")
    return str(commit)
