"""Write a zoo export as a standard transformers checkpoint that needs no remote code: a SpanBERT-family export as
BERT (`BertForPreTraining` weights), a TEAMS/ELECTRA export as Google's ELECTRA release is laid out (the
discriminator in OUTPUT, the generator as `ElectraForMaskedLM` in OUTPUT/generator).

    python training/to_transformers.py runs/spanbert/export runs/spanbert/export-standard

The copy has no code files and no `auto_map`; what has no place in BERT or ELECTRA (SpanBERT's SBO head, TEAMS's MWS
head and task layers, a fine-tuning head) is dropped and named in the copy's card. Before anything is written, the
copy is checked against the export: the same hidden states and head logits on a probe batch (max difference in the
card), else the conversion is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", metavar="EXPORT", help="a zoo export folder (OUTPUT_DIR/export of a pretraining run)")
    parser.add_argument("output", metavar="OUTPUT", help="the folder to write the standard checkpoint into")
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists and is not empty")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    from encoder_zoo.training.run.standard_copy import convert

    output = convert(args.export, args.output, overwrite=args.overwrite)
    print(f"Wrote a standard transformers copy to {output} (its card: {output / 'README.md'}).")
    return output


def cli() -> None:
    """Entry point: bad input ends with one clear line (PRETRAIN_TRACEBACK=1 shows the traceback)."""
    from encoder_zoo.training.run.entry import run_cli

    run_cli(main, "to_transformers.py", traceback_env="PRETRAIN_TRACEBACK")


if __name__ == "__main__":
    cli()
