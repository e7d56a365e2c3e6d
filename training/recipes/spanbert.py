"""`--model spanbert`, its plain BERT-MLM baseline `--model bert`, and the two-segment baselines of the paper's
Tables 6 and 7 (`--model bert_2seq_nsp`, `--model bert_2seq`), on one code path."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import torch

from encoder_zoo.hub_cards.papers import SPANBERT_PAPER
from encoder_zoo.training.data.blocks import pack_segment_pairs
from encoder_zoo.training.masking.spans import INDEX_COLUMN, LINGUISTIC_SCHEMES, SpanMaskingCollator
from encoder_zoo.training.recipes import (
    ENCODER_CLIENTS,
    FILL_MASK,
    PRETRAINING_HEAD,
    STANDARD_CLIENTS,
    ClientColumn,
    CommonTests,
    Family,
    FineTuningPreset,
    Recipe,
    StartingWeights,
    TrainingDefaults,
    encoder_fields,
    pretraining_export,
    standard_copy_export,
)
from encoder_zoo.training.recipes.registry import PER_MICRO_BATCH, LossWeighting
from encoder_zoo.training.run.flops import FlopCount, dense, layer, step_sizes

BERT_SIZES = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


# Section 4 (lr, warmup, linear decay, betas, eps 1e-8, batch 256 x 512, 2.4M steps), with the authors' pretraining
# command (pretraining/README.md) where it differs or the paper is silent: weight decay 0.01 on every parameter
# (the paper's "0.1" contradicts its own "we retain BERT's" and the released models' command), clipping at 1.0.
# The same recipe trained the paper's BERT baseline. base and large share it; small (not in the paper) gets its
# optimiser and schedule without the 256-sequence batch, tiny the same optimiser at a rate for a model trained for
# minutes (`TrainingDefaults.for_tiny`).
SPANBERT_TRAINING = TrainingDefaults(
    size="base",
    source="SpanBERT Sec. 4; weight decay and clipping from the authors' pretraining command",
    learning_rate=1e-4,
    warmup_steps=10_000,
    total_steps=2_400_000,
    adam_epsilon=1e-8,
    weight_decay=0.01,
    decay_norms_and_biases=True,
    max_grad_norm=1.0,
    batch_size=256,
    max_seq_length=512,
)
SPANBERT_TRAINING_BY_SIZE = {
    "tiny": SPANBERT_TRAINING.for_tiny(),
    "small": SPANBERT_TRAINING,
    "base": SPANBERT_TRAINING,
    "large": replace(SPANBERT_TRAINING, size="large"),
}

PAPER_HYPERPARAMETERS = {
    "dropout": "0.1 on all layers and attention",
    "masking": "15% of word pieces, geometric spans p=0.2 clipped at 10 words, 80/10/10 per span",
}
BERT_BASELINE_HYPERPARAMETERS = {**PAPER_HYPERPARAMETERS, "masking": "15% of word pieces, 80/10/10 per token"}


def describe_sbo_loss(trainer, args) -> dict:
    """The card's row on how the SBO term of this run was normalised (the paper does not say; the authors' code
    divides by the number of targets + 1)."""
    config = trainer.model.config
    if not config.use_span_boundary_objective:
        return {}
    if config.sbo_loss_normalization == "authors":
        return {"SBO loss": "summed over a batch's SBO targets, divided by their number + 1, as the authors' code "
                "(`sbo_loss_normalization=authors`; n/(n+1) of the mean for n targets)"}
    return {"SBO loss": "mean over a batch's SBO targets (`sbo_loss_normalization=mean`; the authors' code divides the "
            "sum by the number of targets + 1)"}


def build_span_collator(tokenizer, args, *, span_boundary_targets: bool):
    return SpanMaskingCollator(
        tokenizer,
        scheme=args.masking_scheme,
        mlm_probability=args.mlm_probability,
        random_token_distribution=args.random_token_distribution,
        unigram_probs=getattr(args, "unigram_probs", None),
        span_boundary_targets=span_boundary_targets,
        seed=args.masking_seed,
    )


class SegmentPairCollator:
    """Collates `[CLS] A [SEP] B [SEP]` pairs from `training.data.pack_segment_pairs`.

    Each segment is masked as a block of its own, as the authors' code masks each block of a pair: the 15% budget
    is per segment, and a span, its replacement and its SBO boundaries never cross the middle `[SEP]` (special tokens
    are never masked). Adds `token_type_ids` and, for NSP, `next_sentence_label`.
    """

    SEGMENT_COLUMNS = ("input_ids", "word_start", "linguistic_span")

    def __init__(self, segment_collator: SpanMaskingCollator, next_sentence_prediction: bool):
        self.segment_collator = segment_collator
        self.next_sentence_prediction = next_sentence_prediction

    def set_epoch(self, epoch: int) -> None:
        self.segment_collator.set_epoch(epoch)

    def for_evaluation(self) -> "SegmentPairCollator":
        return SegmentPairCollator(self.segment_collator.for_evaluation(), self.next_sentence_prediction)

    def __call__(self, examples):
        segments, a_lengths, lengths = [], [], []
        for example in examples:
            length = len(example["input_ids"])
            a_length = length - sum(example["token_type_ids"])  # [CLS] A [SEP]
            for half, (start, end) in enumerate(((0, a_length), (a_length, length))):
                segment = {key: example[key][start:end] for key in self.SEGMENT_COLUMNS if key in example}
                # Each segment's mask is keyed by its own index: pair i's A is 2i, its B 2i + 1.
                segment[INDEX_COLUMN] = 2 * example[INDEX_COLUMN] + half
                segments.append(segment)
            a_lengths.append(a_length)
            lengths.append(length)
        masked = self.segment_collator(segments)

        # Stitch segment rows 2i (A) and 2i+1 (B) back into pair row i.
        a_length, length = torch.tensor(a_lengths)[:, None], torch.tensor(lengths)[:, None]
        multiple = self.segment_collator.pad_to_multiple_of or 1
        width = math.ceil(max(lengths) / multiple) * multiple
        position = torch.arange(width)[None, :]
        in_b, real = position >= a_length, position < length
        source_row = 2 * torch.arange(len(examples))[:, None] + in_b.long()
        offset = torch.where(in_b, a_length, 0)
        source_col = (position - offset).clamp(max=masked["input_ids"].shape[1] - 1)

        def stitch(key, fill):
            return torch.where(real, masked[key][source_row, source_col], fill)

        batch = {
            "input_ids": stitch("input_ids", self.segment_collator.tokenizer.pad_token_id),
            "attention_mask": real.long(),
            "token_type_ids": (in_b & real).long(),
            "labels": stitch("labels", -100),
        }
        for key in ("span_left", "span_right"):
            if key in masked:
                boundary = stitch(key, -1)
                batch[key] = torch.where(boundary >= 0, boundary + offset, -1)
        if self.next_sentence_prediction:
            batch["next_sentence_label"] = torch.tensor([e["next_sentence_label"] for e in examples])
        return batch


def build_pair_dataset(documents, tokenizer, args):
    return pack_segment_pairs(
        documents, tokenizer, args.max_seq_length, seed=args.masking_seed,
        annotate_spans=args.masking_scheme if args.masking_scheme in LINGUISTIC_SCHEMES else None,
        spacy_model=args.spacy_model, num_proc=args.preprocessing_num_workers,
    )


def build_pair_collator(tokenizer, args, *, next_sentence_prediction: bool):
    # SBO targets are always built, so `--config_overrides use_span_boundary_objective=true` adds SBO to either recipe.
    return SegmentPairCollator(build_span_collator(tokenizer, args, span_boundary_targets=True),
                               next_sentence_prediction)


def two_segment_recipe(name: str, summary: str, *, next_sentence_prediction: bool) -> Recipe:
    """A baseline on BERT's segment pairs; `--masking_scheme` gives Table 6's rows, `--config_overrides
    use_span_boundary_objective=true` adds SBO."""
    return Recipe(
        name=name,
        family="spanbert",
        summary=summary,
        sizes=BERT_SIZES,
        training_defaults=SPANBERT_TRAINING_BY_SIZE,
        build_collator=lambda tokenizer, args: build_pair_collator(tokenizer, args,
                                                                   next_sentence_prediction=next_sentence_prediction),
        build_dataset=build_pair_dataset,
        config_overrides={"use_span_boundary_objective": False,
                          "use_next_sentence_prediction": next_sentence_prediction},
        logged_outputs=("mlm_loss", "sbo_loss", *(("nsp_loss", "nsp_accuracy") if next_sentence_prediction else ())),
        comparable_outputs=("mlm_loss",),
        perplexity_of=("mlm_loss",),
        default_masking_scheme="subword",
        paper=SPANBERT_PAPER,
        hyperparameters=BERT_BASELINE_HYPERPARAMETERS,
        describe_training=describe_sbo_loss,
        loss_weighting=SPANBERT_LOSS_WEIGHTING,
    )


TWO_SEGMENT_SUMMARY = (
    "pairs of segments `[CLS] A [SEP] B [SEP]` built as BERT builds them (B continues A half of the time, else comes "
    "from another document; together up to the block length), each segment masked on its own"
)

# SpanBERT's fairseq criterion (pretraining/fairseq/criterions/spanbert_loss.py) returns, per batch,
# `lm_loss / ntokens + pair_loss / npairs`; the trainer's division by the gathered sample size is one global scale that
# Adam cancels. So each micro-batch's terms are its own means and micro-batches weigh equally; BERT's baselines on this
# code path do the same.
SPANBERT_LOSS_WEIGHTING = LossWeighting(
    PER_MICRO_BATCH, "SpanBERT's fairseq criterion (spanbert_loss.py): each batch's MLM and SBO (and NSP) terms are "
    "means over that batch's targets, summed; the batches of an update weigh equally")

RECIPES = {
    "spanbert": Recipe(
        name="spanbert",
        family="spanbert",
        summary="SpanBERT: geometric span masking + span boundary objective (SBO), single-sequence blocks, no NSP.",
        sizes=BERT_SIZES,
        training_defaults=SPANBERT_TRAINING_BY_SIZE,
        build_collator=lambda tokenizer, args: build_span_collator(tokenizer, args, span_boundary_targets=True),
        config_overrides={"use_span_boundary_objective": True},
        logged_outputs=("mlm_loss", "sbo_loss"),
        comparable_outputs=("mlm_loss",),
        perplexity_of=("mlm_loss", "sbo_loss"),
        default_masking_scheme="span",
        paper=SPANBERT_PAPER,
        hyperparameters=PAPER_HYPERPARAMETERS,
        describe_training=describe_sbo_loss,
        loss_weighting=SPANBERT_LOSS_WEIGHTING,
    ),
    "bert": Recipe(
        name="bert",
        family="spanbert",
        summary="BERT-MLM baseline on SpanBERT's code path: subword masking, no SBO, single-sequence blocks.",
        sizes=BERT_SIZES,
        training_defaults=SPANBERT_TRAINING_BY_SIZE,
        build_collator=lambda tokenizer, args: build_span_collator(tokenizer, args, span_boundary_targets=False),
        config_overrides={"use_span_boundary_objective": False},
        logged_outputs=("mlm_loss",),
        comparable_outputs=("mlm_loss",),
        perplexity_of=("mlm_loss",),
        default_masking_scheme="subword",
        paper=None,
        hyperparameters=BERT_BASELINE_HYPERPARAMETERS,
        loss_weighting=SPANBERT_LOSS_WEIGHTING,
    ),
    "bert_2seq_nsp": two_segment_recipe(
        "bert_2seq_nsp",
        "Two-segment baseline with next sentence prediction (the bi-sequence setup of SpanBERT's Tables 6 and 7): "
        f"{TWO_SEGMENT_SUMMARY}, MLM + NSP, no SBO.",
        next_sentence_prediction=True,
    ),
    "bert_2seq": two_segment_recipe(
        "bert_2seq",
        f"Two-segment baseline without next sentence prediction: {TWO_SEGMENT_SUMMARY}, MLM only (the NSP loss is "
        "off, as in BERT's no-NSP ablation that SpanBERT's Section 5 discusses).",
        next_sentence_prediction=False,
    ),
}


def flop_kind(model, inputs: dict) -> str:
    """"spanbert" where the SBO head runs (the model has one and the batch carries span boundaries), else "bert". The
    NSP head of the two-segment baselines (bert_2seq_nsp: pooler and a 2-way classifier on [CLS], plus [CLS]'s row of
    the last feed-forward block) is a few rows per sequence against all the tokens: not counted."""
    return "spanbert" if model.config.use_span_boundary_objective and "span_left" in inputs else "bert"


def train_step_flops(kind: str, model, inputs: dict) -> int:
    """Model FLOPs of a train step of `SpanBertForPreTraining` with SBO ("spanbert") or without ("bert")."""
    tokens, squared, targets = step_sizes(inputs)
    config = model.config
    d, ff, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    read = inputs["labels"] != -100
    flops = dense(targets, d, d) + dense(targets, d, vocab)
    if kind == "spanbert":
        rows, cols, left, right = model.sbo_targets(inputs["span_left"], inputs["span_right"])
        read[rows, left] = read[rows, right] = True
        n = rows.numel()
        flops += dense(n, 2 * d + config.sbo_position_embedding_size, d) + dense(n, d, d) + dense(n, d, vocab)
    flops += (config.num_hidden_layers - 1) * layer(tokens, squared, d, ff)
    return flops + layer(tokens, squared, d, ff, feed_forward_rows=int(read.sum()))


# SpanBERT App. B: lr grid {5e-6, 1e-5, 2e-5, 3e-5, 5e-5}, batch {16, 32}, 10 epochs (CoLA 4: "10 epochs lead to severe
# overfitting"), max_seq_length 128. Its code/run_glue.py: BertAdam (eps 1e-6, weight decay 0.01), 10% warmup then
# linear decay, clipping at 1.0.
GLUE_PRESET = FineTuningPreset(
    flags=["--learning_rate", "2e-5", "--per_device_train_batch_size", "32", "--num_train_epochs", "10",
           "--warmup_steps", "0.1", "--lr_scheduler_type", "linear", "--adam_epsilon", "1e-6",
           "--weight_decay", "0.01", "--max_grad_norm", "1.0", "--max_seq_length", "128"],
    epochs_by_task={"cola": "4"},
)


def common_test_config(tester, **overrides):
    """A tiny SpanBERT config for transformers' common tests."""
    from encoder_zoo import models

    return models.get_class("spanbert", "AutoConfig")(
        vocab_size=tester.vocab_size, hidden_size=tester.hidden_size, num_hidden_layers=tester.num_hidden_layers,
        num_attention_heads=tester.num_attention_heads, intermediate_size=tester.intermediate_size,
        type_vocab_size=tester.type_vocab_size, max_position_embeddings=64, sbo_position_embedding_size=8,
        max_span_targets=4, **overrides,
    )


def span_targets(input_ids, tester) -> dict:
    """MLM targets at positions 1..3 and one span over them, with its outside boundaries 0 and 4."""
    labels = torch.full_like(input_ids, -100)
    labels[:, 1:4] = input_ids[:, 1:4]
    span_left, span_right = torch.full_like(input_ids, -1), torch.full_like(input_ids, -1)
    span_left[:, 1:4], span_right[:, 1:4] = 0, 4
    return {"labels": labels, "span_left": span_left, "span_right": span_right}


def span_and_nsp_targets(input_ids, tester) -> dict:
    return {**span_targets(input_ids, tester), "next_sentence_label": torch.zeros(len(input_ids), dtype=torch.long)}


def bert_sources(name: str, config) -> list[tuple[str, str]]:
    """Where a SpanBERT parameter is in a transformers BERT checkpoint: the encoder under `bert.`
    (`BertForPreTraining`, `BertForMaskedLM`) or at the top (`BertModel`, a sentence-transformers BERT); the MLM and
    NSP heads (`cls.`) under the same names. BERT has no SBO head."""
    if name.startswith("spanbert."):
        encoder = name.removeprefix("spanbert.")
        return [("--init_from", f"bert.{encoder}"), ("--init_from", encoder)]
    return [("--init_from", name)] if name.startswith("cls.") else []


def bert_tied_reads(name: str, config) -> list[tuple[str, str]]:
    """BERT's MLM decoder is tied to its word embeddings (and its bias to `cls.predictions.bias`), as SpanBERT's."""
    return [("--init_from", name)] if name.startswith("cls.predictions.decoder.") else []


def bert_notes(config, flags=()) -> list[str]:
    notes = ["MLM head (`cls.predictions`) and NSP head (`cls.seq_relationship`): loaded where the checkpoint has them "
             "(BertForMaskedLM, BertForPreTraining), else new." if config.use_next_sentence_prediction else
             "MLM head (`cls.predictions`): loaded where the checkpoint has one (BertForMaskedLM, BertForPreTraining), "
             "else new; this model has no NSP head, so a checkpoint's (`cls.seq_relationship`) is not used."]
    if config.use_span_boundary_objective:
        notes.append("SBO head (`sbo`): new (BERT has none); its output layer is tied to the loaded word embeddings.")
    return notes


FAMILY = Family(
    name="spanbert",
    starting_weights=StartingWeights(model_types=("bert",), config=lambda main, generator: encoder_fields(main),
                                     sources=bert_sources, also_reads=bert_tied_reads, notes=bert_notes),
    flops=FlopCount(kinds=("spanbert", "bert"), choose=flop_kind, count=train_step_flops),
    glue_presets={"spanbert": GLUE_PRESET},
    common_tests=(
        CommonTests(name="SpanBert", model_type="spanbert", config=common_test_config, works_with_column="spanbert",
                    pretraining_heads=("AutoModelForPreTraining",), pretraining_labels=span_targets,
                    config_tester={"hidden_size": 37}),
        # The two-segment baselines (bert_2seq_nsp): BERT's NSP head and pooler.
        CommonTests(name="SpanBertWithNsp", model_type="spanbert",
                    config=functools.partial(common_test_config, use_next_sentence_prediction=True),
                    works_with_column="spanbert",
                    heads=("AutoModelForPreTraining", "AutoModelForSequenceClassification"),
                    pretraining_heads=("AutoModelForPreTraining",), pretraining_labels=span_and_nsp_targets,
                    config_tester={"hidden_size": 37}),
    ),
    client_matrix=(
        ClientColumn("spanbert", (FILL_MASK, PRETRAINING_HEAD, *ENCODER_CLIENTS), pretraining_export("spanbert")),
        # The standard BERT copies (training/to_transformers.py), loaded without remote code.
        ClientColumn("spanbert (standard BERT)", (FILL_MASK, PRETRAINING_HEAD, *STANDARD_CLIENTS),
                     standard_copy_export(pretraining_export("spanbert"))),
        ClientColumn("bert_2seq_nsp (standard BERT)", (FILL_MASK, PRETRAINING_HEAD, *STANDARD_CLIENTS),
                     standard_copy_export(pretraining_export("spanbert", use_span_boundary_objective=False,
                                                             use_next_sentence_prediction=True))),
    ),
)
