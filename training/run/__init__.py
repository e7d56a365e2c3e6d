"""Run plumbing shared by every entry point: the Trainer subclasses, stop signals and the divergence guard
(`trainer`), run folders and checkpoints (`folders`), one run per folder (`locks`), loading a model with clear errors
(`loading`), model FLOPs of a train step (`flops`), FSDP2 (`sharding`), the export and its card (`export`), inputs
a model needs beyond its tokenizer's (`task_inputs`), what installed packages add to the registries (`plugins`),
elastic runs (`elastic`: the global batch kept across world sizes, `--loss_normalization`), the standard BERT/ELECTRA
copy of an export (`standard_copy`), the SpanBERT authors' fairseq checkpoint (`fairseq_checkpoint`), and what
every script's command line shares (`entry`: `run_cli`, the one `cli()` wrapper).

This package is also the one public face of `training/` for the fine-tuning scripts in `glue/` and `qa/`: they import
only the names below, never a module inside `training/` directly.
"""

import importlib

# Exit status of a run stopped because it diverged (docs/reliability.md): 0 is success, 2 bad input, 130/143 a stop
# signal. Defined here, with the flag's help, so that argument parsers can name them without importing Trainer.
DIVERGED_EXIT_CODE = 3
MAX_NONFINITE_STEPS_HELP = (
    "Stop the run (exit status 3; nothing saved or exported from the bad step) once this many optimizer steps in a row "
    "have a non-finite (NaN/inf) loss, objective loss or gradient norm; a non-finite step below the limit is skipped, "
    "not applied. Default: 1, or 20 with --fp16, whose loss scaling skips steps by design.")

# Each public name and the module that defines it, imported on first use (PEP 562): importing one module of this
# package (the trainer, say) does not load the corpus readers or the model registry.
_PUBLIC = {
    "EMBEDDED_CORPUS": "encoder_zoo.training.data.corpus",  # the embedded offline Wikipedia: qa/ derives wiki_cloze
    "load_corpus": "encoder_zoo.training.data.corpus",
    "split_sentences": "encoder_zoo.training.data.corpus",
    "minilm_path": "encoder_zoo.training.data.resources",
    "hub_origin": "encoder_zoo.hub_cards.origins",  # a shipped model's Hub id and licence, for cards
    "resource_path": "encoder_zoo.training.data.resources",
    "without_loading_state": "encoder_zoo.training.data.tokenizer",  # what a tokenizer saved after loading leaves out
    "check_new_output_dir": "encoder_zoo.training.run.folders",
    "check_model_path": "encoder_zoo.training.run.loading",
    "damaged_checkpoint": "encoder_zoo.training.run.loading",
    "damaged_weights": "encoder_zoo.training.run.loading",
    "load_pretrained": "encoder_zoo.training.run.loading",
    "parse_overrides": "encoder_zoo.training.run.loading",
    "pin_memory_only_with_an_accelerator": "encoder_zoo.training.run.loading",
    "extra_inputs_for": "encoder_zoo.training.run.task_inputs",
    "RunInterrupted": "encoder_zoo.training.run.entry",
    "stop_on_sigterm": "encoder_zoo.training.run.entry",
    "stopped_by": "encoder_zoo.training.run.entry",
    "parse_fine_tuning_args": "encoder_zoo.training.run.entry",
    "run_cli": "encoder_zoo.training.run.entry",
    "merged_with_plugins": "encoder_zoo.training.run.plugins",
    "FineTuningTrainer": "encoder_zoo.training.run.trainer",
    "DivergenceGuard": "encoder_zoo.training.run.trainer",  # FineTuningTrainer adds one; the class, for other Trainers
    "TrainingDiverged": "encoder_zoo.training.run.trainer",
    "SaveFailed": "encoder_zoo.training.run.trainer",
    "FolderInUse": "encoder_zoo.training.run.locks",
    "hold": "encoder_zoo.training.run.locks",
    "hold_run_folder": "encoder_zoo.training.run.locks",
    "release": "encoder_zoo.training.run.locks",
    "try_hold": "encoder_zoo.training.run.locks",
    "wait_and_hold": "encoder_zoo.training.run.locks",
}
__all__ = sorted([*_PUBLIC, "DIVERGED_EXIT_CODE", "MAX_NONFINITE_STEPS_HELP"])


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return __all__
