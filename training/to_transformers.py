"""Write a zoo export as a standard transformers checkpoint that needs no remote code: a SpanBERT-family export as
BERT (`BertForPreTraining`, or `BertForMaskedLM` without NSP), a TEAMS/ELECTRA export as Google's ELECTRA release is
laid out: the discriminator in OUTPUT (the layers fine-tuning reads), the generator as `ElectraForMaskedLM` in
OUTPUT/generator and, for TEAMS, its RTD path (the shared layers, the RTD task layer and head) as an
`ElectraForPreTraining` of its own in OUTPUT/rtd.

    python training/to_transformers.py runs/spanbert/export runs/spanbert/export-standard

The copy has no code files and no `auto_map`, and its tokenizer is BERT's or ELECTRA's fast tokenizer, so
transformers 4.57 and 5 both load it. What has no place in BERT or ELECTRA (SpanBERT's SBO head, TEAMS's MWS head,
a fine-tuning head) is dropped and named in the copy's card; TEAMS's task layers are kept (by default the MWS one as
the top of OUTPUT, the RTD one in OUTPUT/rtd). `pretrain.py --init_from OUTPUT` (or OUTPUT/rtd) continues the whole
copy: the run equals the export at step 0, with only the dropped heads new. Before anything is written, the copy is
checked against the export: the same hidden states and head logits on a probe batch (max difference in the card),
else the conversion is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", metavar="EXPORT", help="a zoo export folder (OUTPUT_DIR/export of a pretraining run)")
    parser.add_argument("output", metavar="OUTPUT", help="the folder to write the standard checkpoint into")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUTPUT if it exists and is not empty (the old copy is kept until the new one is "
                             "in place)")
    parser.add_argument("--without_generator", action="store_true",
                        help="convert a TEAMS/ELECTRA export that lacks its generator (refused otherwise): the copy "
                             "has no generator/ folder and its card says so")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    from encoder_zoo.training.run.standard_copy import convert

    output = convert(args.export, args.output, overwrite=args.overwrite,
                     without_generator=args.without_generator)
    print(f"Wrote a standard transformers copy to {output} (its card: {output / 'README.md'}).")
    return output


def cli() -> None:
    """Entry point: bad input ends with one clear line (PRETRAIN_TRACEBACK=1 shows the traceback)."""
    from encoder_zoo.training.run.entry import run_cli

    run_cli(main, "to_transformers.py", traceback_env="PRETRAIN_TRACEBACK")


if __name__ == "__main__":
    cli()
