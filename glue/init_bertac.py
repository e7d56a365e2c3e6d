"""Create a BERTAC model from a pretrained encoder and a part-1 CNN export, ready for `glue/run_glue.py` and
`qa/run_qa.py`.

    python glue/init_bertac.py --cnn runs/bertac-cnn/export --output_dir runs/bertac-init [--backbone albert-xxlarge-v2]
    python glue/run_glue.py --model_name_or_path runs/bertac-init --trust_remote_code --ignore_mismatched_sizes ...
    python qa/run_qa.py --model_name_or_path runs/bertac-init --trust_remote_code ...

Without --backbone it uses the pretrained MiniLM shipped in a PyPI package (offline default). The paper's encoders:
`--backbone albert/albert-xxlarge-v2` with `--tier_hidden_size 1024 --tier_intermediate_size 4096`
`--tier_num_attention_heads 64` (TIER layers at 1024 between 4096 -> 1024 -> 4096 projections) or
`--backbone FacebookAI/roberta-large` (TIER layers at the encoder's width). The folder holds the weights (encoder,
TIER layers, CNN, its frozen word table and the word lookup tables), the encoder's tokenizer and a model card; it
loads through every Auto class in its auto_map.

Ablations (Tables 4 and 8): --cnn_weights random (a CNN trained from scratch during fine-tuning), a self-supervised
CNN export as --cnn, --without_update, --without_cnn_and_tier (the encoder alone with the same head).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoTokenizer

from encoder_zoo import models  # registers BERTAC so its code is saved with the checkpoint
from encoder_zoo.hub_cards import display_name
from encoder_zoo.models.bertac.modeling_bertac import BertacForQuestionAnswering, BertacForSequenceClassification
from encoder_zoo.training.run import (
    check_model_path,
    check_new_output_dir,
    damaged_checkpoint,
    run_cli,
    without_loading_state,
)

HEADS = {"classification": BertacForSequenceClassification, "question_answering": BertacForQuestionAnswering}
# BERTAC Sections 5.1.1 and 5.2.2 (Tables 9 and 10), for the card.
PAPER_FINE_TUNING = {
    "GLUE": "lr in {8e-6, 9e-6, 1e-5, 2e-5, 3e-5}, 6% warmup then linear decay, length 128, batch 128 (MNLI, QQP) "
            "or 16, epochs 1-5 (MNLI, QQP, QNLI) or 6-10, 5 seeds, the best of 9 CNNs per task "
            "(`glue/run_glue.py --preset bertac`)",
    "open-domain QA": "lr 1e-5, 2 epochs, 6% warmup then linear decay, length 384, stride 128, batch 48 "
                      "(Quasar-T) or 96 (SearchQA), 3-best spans (`qa/run_open_qa.py` defaults)",
    "TIER layers": "3",
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default=None, help="Encoder path or Hub id (default: the offline MiniLM).")
    parser.add_argument("--cnn", default=None, help="A `--model bertac_cnn` export (folder or Hub id): the CNN, its "
                        "frozen word table and word tokenizer. Not needed with --without_cnn_and_tier.")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--head", choices=sorted(HEADS), default="classification",
                        help="The head saved (every head loads from the folder; the other starts random).")
    parser.add_argument("--num_labels", type=int, default=2, help="Classification labels; 1 for regression.")
    parser.add_argument("--num_tier_layers", type=int, default=3)
    parser.add_argument("--tier_hidden_size", type=int, default=None, help="Default: the encoder's width.")
    parser.add_argument("--tier_intermediate_size", type=int, default=None)
    parser.add_argument("--tier_num_attention_heads", type=int, default=None)
    parser.add_argument("--cnn_weights", choices=["pretrained", "random"], default="pretrained",
                        help="random: Table 4's randomly initialised CNN, trained during fine-tuning.")
    parser.add_argument("--without_update", action="store_true", help="Table 8's 'w/o update': no CNN input update.")
    parser.add_argument("--without_cnn_and_tier", action="store_true", help="Table 8's 'w/o CNN and TIER'.")
    parser.add_argument("--detach_cnn_output", action="store_true",
                        help="As the authors' code: no gradient into the input-update layers.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the new layers' random initialisation.")
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="Allow a backbone whose code is in its folder (zoo exports load without it: their classes "
                        "are registered here).")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="Write into a folder that holds files.")
    return parser.parse_args(argv)


def main(argv=None) -> str:
    options = parse_args(argv)
    output = Path(options.output_dir)
    if options.backbone is None:
        from encoder_zoo.training.run import minilm_path

        options.backbone = minilm_path()
    if options.cnn is None and not options.without_cnn_and_tier:
        raise ValueError("--cnn is required: a `training/pretrain.py --model bertac_cnn` export (or pass "
                         "--without_cnn_and_tier for the encoder alone).")
    check_new_output_dir(output, options.overwrite_output_dir)  # after --cnn's check: that refusal leaves no folder
    check_model_path(options.backbone, "--backbone")
    if options.cnn is not None:
        check_model_path(options.cnn, "--cnn")
    torch.manual_seed(options.seed)
    try:
        check_backbone_is_an_encoder(options.backbone)
        model = HEADS[options.head].from_pretrained_parts(
            options.backbone, options.cnn, cnn_weights=options.cnn_weights, num_labels=options.num_labels,
            trust_remote_code=options.trust_remote_code,
            num_tier_layers=options.num_tier_layers, tier_hidden_size=options.tier_hidden_size,
            tier_intermediate_size=options.tier_intermediate_size,
            tier_num_attention_heads=options.tier_num_attention_heads, update_cnn_input=not options.without_update,
            use_cnn_and_tier=not options.without_cnn_and_tier, detach_cnn_output=options.detach_cnn_output,
        )
    except (ValueError, OSError, KeyError, TypeError, AttributeError, SafetensorError) as error:
        for flag, path in (("--backbone", options.backbone), ("--cnn", options.cnn)):
            problem = path and damaged_checkpoint(path)
            if problem:
                raise ValueError(f"{flag} {path}: {problem}; re-export or re-download the checkpoint.") from None
        if "trust_remote_code=True" in str(error) and not options.trust_remote_code:
            raise ValueError(f"--backbone {options.backbone} runs model code saved with it (its .py files): pass "
                             "--trust_remote_code to allow that, once you trust where it comes from.") from None
        if isinstance(error, ValueError):  # BERTAC's own checks: they name the flag or the part
            raise
        reason = str(error).strip().splitlines()[0]
        raise ValueError(f"Cannot build BERTAC from --backbone {options.backbone} and --cnn {options.cnn} "
                         f"({reason}).") from None
    model.save_pretrained(output)
    without_loading_state(AutoTokenizer.from_pretrained(options.backbone)).save_pretrained(output)
    write_model_card(model, options, output)
    print(f"BERTAC over {display_name(options.backbone)} saved to {output}")
    return str(output)


def check_backbone_is_an_encoder(backbone: str) -> None:
    """BERTAC's TIER layers read an encoder's token states: a HIRE, BERTAC or BERTAC-CNN checkpoint is not one."""
    from transformers import PreTrainedConfig

    model_type = PreTrainedConfig.get_config_dict(backbone)[0].get("model_type")
    if model_type in ("hire", "bertac", "bertac_cnn"):
        extra = " (pass it as --cnn)" if model_type == "bertac_cnn" else " (pass the encoder it was built on)"
        raise ValueError(f"--backbone {backbone} is a {model_type!r} checkpoint, not an encoder: BERTAC's TIER layers "
                         f"read an encoder's token states{extra}.")


def write_model_card(model, options, output: Path) -> Path:
    from encoder_zoo.hub_cards.initialised import write_initialised_card
    from encoder_zoo.hub_cards.papers import BERTAC_PAPER
    from encoder_zoo.models.bertac.modeling_bertac import backbone_code_files

    config = model.config
    architecture = {}
    if config.use_cnn_and_tier:
        tier, cnn = config.tier_layer_config(), config.cnn_config
        architecture.update({
            "CNN": f"{display_name(options.cnn)}: windows {cnn.filter_windows} x {cnn.num_filters} filters "
                   f"(de = {cnn.output_size}), pretrained as "
                   f"{'F of the GAN' if cnn.pretraining_objective == 'gan' else 'the self-supervised ablation'}",
            "CNN weights": "random, trained during fine-tuning" if config.cnn_trainable else "pretrained, frozen",
            "CNN word table": f"{cnn.vocab_size} words x {cnn.word_embedding_dim} (frozen)",
            "word lookup": f"{config.word_lookup_size} encoder words -> CNN words (rebuilt from input_ids)",
            "TIER layers": f"{config.num_tier_layers} x width {tier.hidden_size}, {tier.num_attention_heads} heads, "
                           f"FFN {tier.intermediate_size}",
            "projections": (f"{config.backbone_hidden_size} -> {tier.hidden_size} -> {config.backbone_hidden_size}"
                            if tier.hidden_size != config.backbone_hidden_size
                            else "none (TIER at the encoder's width)"),
            "CNN input update": "yes" if config.update_cnn_input else "no (ablation 'w/o update')",
            "gradient into the update layers": ("no (detached, as the authors' code)" if config.detach_cnn_output
                                                else "yes (as the paper)"),
        })
    else:
        architecture["CNN and TIER"] = "none (ablation 'w/o CNN and TIER': the encoder alone with the same head)"
    parameters = sum(p.numel() for p in model.parameters())
    encoder_parameters = sum(p.numel() for p in model.bertac.backbone.parameters())
    architecture["parameters"] = f"{parameters:,} ({(parameters / encoder_parameters - 1) * 100:.1f}% over the encoder)"
    encoder = model.bertac.backbone
    return write_initialised_card(
        model, encoder, options.backbone, backbone_code_files(encoder), output, architecture=architecture,
        summary="BERTAC: a GAN-pretrained CNN fused into a transformer encoder through TIER layers (Oh et al., 2021), "
                "initialised from pretrained parts and not fine-tuned yet. Fine-tune it with `glue/run_glue.py` or "
                "`qa/run_qa.py` (they add the noun-phrase masks the CNN reads).",
        peft_target_modules=models.PEFT_TARGET_MODULES.get(config.model_type),
        tags=["bertac", "text-classification", "question-answering"],
        paper=BERTAC_PAPER,
        training_data="Not fine-tuned: the encoder and the CNN are pretrained, the TIER, update and head layers are "
                      "random (seed %d)." % options.seed,
        paper_hyperparameters=PAPER_FINE_TUNING,
        intended_use="A starting point for fine-tuning. Inputs are the encoder tokenizer's plus `entity_spans` (the "
                     "noun phrase each segment's CNN sees as [EM]; `training/masking/entity_spans.py` makes them; "
                     "without them the CNN reads the unmasked words, the paper's m = s).",
        limitations=[
            "The CNN reads words rebuilt from the encoder's pieces; words the CNN vocabulary lacks (or, for cased and "
            "byte-level BPE encoders, forms the lookup does not hold) become [UNK].",
            "Deviations from the authors' code: padding never enters the CNN's mean, the bilinear softmax or the TIER "
            "attention; the input-update layers receive gradient (the code detaches the CNN output); no update layer "
            "after the last TIER; no [MASK] prepended when no noun phrase is found (the paper's m = s).",
        ],
    )


def cli() -> None:
    run_cli(main, "init_bertac.py")


if __name__ == "__main__":
    cli()
