"""`--model spanbert` and its plain BERT-MLM baseline `--model bert`, on one code path."""

from __future__ import annotations

from .masking import SpanMaskingCollator
from .recipes import Paper, Recipe

BERT_SIZES = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}

SPANBERT_PAPER = Paper(
    title="SpanBERT: Improving Pre-training by Representing and Predicting Spans",
    authors="Mandar Joshi, Danqi Chen, Yinhan Liu, Daniel S. Weld, Luke Zettlemoyer, Omer Levy",
    year=2020,
    url="https://arxiv.org/abs/1907.10529",
    bibtex="""@article{joshi2020spanbert,
  title={{SpanBERT}: Improving Pre-training by Representing and Predicting Spans},
  author={Joshi, Mandar and Chen, Danqi and Liu, Yinhan and Weld, Daniel S. and Zettlemoyer, Luke and Levy, Omer},
  journal={Transactions of the Association for Computational Linguistics},
  volume={8},
  pages={64--77},
  year={2020}
}""",
)

PAPER_HYPERPARAMETERS = {
    "peak learning rate": "1e-4, linear warmup 10k steps, linear decay",
    "optimizer": "AdamW (beta1 0.9, beta2 0.999, eps 1e-8), decoupled weight decay 0.1",
    "batch": "256 sequences x 512 tokens, 2.4M steps",
    "dropout": "0.1 on all layers and attention",
    "masking": "15% of word pieces, geometric spans p=0.2 clipped at 10 words, 80/10/10 per span",
}


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


RECIPES = {
    "spanbert": Recipe(
        name="spanbert",
        family="spanbert",
        summary="SpanBERT: geometric span masking + span boundary objective (SBO), single-sequence blocks, no NSP.",
        sizes=BERT_SIZES,
        build_collator=lambda tokenizer, args: build_span_collator(tokenizer, args, span_boundary_targets=True),
        config_overrides={"use_span_boundary_objective": True},
        logged_outputs=("mlm_loss", "sbo_loss"),
        perplexity_of=("mlm_loss", "sbo_loss"),
        default_masking_scheme="span",
        paper=SPANBERT_PAPER,
        hyperparameters=PAPER_HYPERPARAMETERS,
    ),
    "bert": Recipe(
        name="bert",
        family="spanbert",
        summary="BERT-MLM baseline on SpanBERT's code path: subword masking, no SBO, single-sequence blocks.",
        sizes=BERT_SIZES,
        build_collator=lambda tokenizer, args: build_span_collator(tokenizer, args, span_boundary_targets=False),
        config_overrides={"use_span_boundary_objective": False},
        logged_outputs=("mlm_loss",),
        perplexity_of=("mlm_loss",),
        default_masking_scheme="subword",
        paper=None,
        hyperparameters=PAPER_HYPERPARAMETERS,
    ),
}
