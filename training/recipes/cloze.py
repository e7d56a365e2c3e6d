"""`--model cloze`: the two-tower cloze language model, trained on paragraphs marked with boundary tokens."""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import datasets
import torch

from encoder_zoo.hub_cards.papers import CLOZE_PAPER
from encoder_zoo.training.data.tokenizer import boundary_token_ids, train_word_tokenizer, train_wordpiece_tokenizer
from encoder_zoo.training.recipes import (
    ENCODER_CLIENTS,
    FILL_MASK,
    PRETRAINING_HEAD,
    ClientColumn,
    CommonTests,
    Family,
    FineTuningPreset,
    Recipe,
    TrainingDefaults,
    pretraining_export,
)
from encoder_zoo.training.recipes.registry import PER_UPDATE, LossWeighting
from encoder_zoo.training.run.flops import FlopCount, attention, dense, layer, step_sizes

logger = logging.getLogger(__name__)

# Table 1 with the BPE vocabulary: d = 1024, FFN 4096, 16 heads; base 6 blocks per tower and a summed query, large
# 12 blocks, 32 combination heads and a concatenated query. (Table 1's 12 combination heads for the base model do
# not divide d = 1024; base uses 16.) tiny and small are for tests and smoke runs.
CLOZE_SIZES = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, combination_attention_heads=2,
                 intermediate_size=512, query_combination="sum"),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, combination_attention_heads=4,
                  intermediate_size=1024, query_combination="sum"),
    "base": dict(hidden_size=1024, num_hidden_layers=6, num_attention_heads=16, combination_attention_heads=16,
                 intermediate_size=4096, query_combination="sum"),
    "large": dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, combination_attention_heads=32,
                  intermediate_size=4096, query_combination="concat"),
}
# The CNN models of Table 1 (177M and 330M parameters without the softmax, as these presets): the same towers over a
# word vocabulary, a character CNN for the inputs (Section 5.2: byte embeddings 128, filters 1x128 .. 6x512, one
# highway layer) and an adaptive softmax for the outputs. A word-level tokenizer is trained for them.
_CHARACTER_INPUTS = dict(input_representation="char_cnn", use_adaptive_softmax=True)
CLOZE_SIZES.update({
    "cnn_tiny": {**CLOZE_SIZES["tiny"], **_CHARACTER_INPUTS, "character_embedding_size": 16,
                 "character_filters": [[1, 32], [2, 32], [3, 64], [4, 64]], "max_word_characters": 20},
    "cnn_base": {**CLOZE_SIZES["base"], **_CHARACTER_INPUTS},
    "cnn_large": {**CLOZE_SIZES["large"], **_CHARACTER_INPUTS},
})


def build_cloze_tokenizer(train_docs, args, config_kwargs: dict[str, Any]):
    """Word-level vocabulary for character-CNN inputs (its `--tokenizer_vocab_size` most frequent words seen twice
    or more; the paper keeps 700K / 1M output types), else the zoo's cased WordPiece (the BPE model's stand-in)."""
    if config_kwargs.get("input_representation") == "char_cnn":
        logger.info("Training a word-level tokenizer (up to %d words) for the character CNN", args.tokenizer_vocab_size)
        return train_word_tokenizer(train_docs["text"], vocab_size=args.tokenizer_vocab_size)
    logger.info("Training a cased WordPiece tokenizer (%d pieces)", args.tokenizer_vocab_size)
    return train_wordpiece_tokenizer(train_docs["text"], vocab_size=args.tokenizer_vocab_size)


def spell_word_vocabulary(model, tokenizer, train_docs, args, training_args) -> None:
    """Character-CNN inputs: write the tokenizer's words into the model's saved word -> bytes table."""
    if model.config.input_representation != "char_cnn":
        return
    truncated = model.cloze.set_word_vocabulary(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
    if truncated:
        logger.warning("%d words are longer than max_word_characters=%d bytes; the character CNN reads their start.",
                       truncated, model.config.max_word_characters)


# Section 5.3: Nesterov's accelerated gradient with momentum 0.99 (torch's SGD(nesterov=True) is the same update
# as fairseq's NAG, learning-rate changes included), gradients renormalised above norm 0.1 (= clipping at 0.1), the
# learning rate warmed up linearly from 1e-7 to 1 over 16k steps, then one cosine cycle down to 1e-4; 600k updates
# (base) / 1M (large). No weight decay (the paper names none; fairseq's default is 0). The paper does not give the
# batch: paragraphs of any length, pretrain.py's per-device batch. tiny and small (not in the paper) get base's.
_CLOZE = dict(source="Cloze-driven pretraining Sec. 5.3 and Table 1", learning_rate=1.0, warmup_steps=16_000,
              optim="sgd", optim_args="momentum=0.99,nesterov=True", weight_decay=0.0,
              lr_scheduler_type="cosine_warmup_with_min_lr",
              lr_scheduler_kwargs={"min_lr": 1e-4, "warmup_lr_rate": 1e-7}, max_grad_norm=0.1, max_seq_length=512)
CLOZE_TRAINING = {
    "base": TrainingDefaults(size="base", total_steps=600_000, **_CLOZE),
    "large": TrainingDefaults(size="large", total_steps=1_000_000, **_CLOZE),
}
CLOZE_TRAINING["tiny"] = CLOZE_TRAINING["small"] = CLOZE_TRAINING["base"]
# The CNN models train as the BPE ones of their size (Section 5.3 gives one recipe per size).
CLOZE_TRAINING.update(cnn_tiny=CLOZE_TRAINING["base"], cnn_base=CLOZE_TRAINING["base"],
                      cnn_large=CLOZE_TRAINING["large"])

CLOZE_HYPERPARAMETERS = {
    "dropout": "0.1 model and attention, 0.05 after ReLU",
    "examples": "paragraphs of arbitrary length with boundary markers; every token is a target",
    "inputs": "BPE (55K types, tied flat softmax) or, for the CNN models, a character CNN over words with an "
    "adaptive softmax over the 700K (base) / 1M (large) most frequent words",
}

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n|\n")


def paragraph_examples(corpus: datasets.Dataset, tokenizer, args) -> datasets.Dataset:
    """One example per paragraph, `<s> paragraph </s>` (`[CLS] x [SEP]` with BERT tokenizers). A paragraph longer
    than `max_seq_length` continues in further examples instead of being cut off."""
    return corpus.map(paragraph_packer(tokenizer, args), batched=True, remove_columns=corpus.column_names,
                      num_proc=args.preprocessing_num_workers, desc="Paragraph examples")


def paragraph_packer(tokenizer, args):
    """The batch function of `paragraph_examples` (documents -> paragraph examples), also applied by --streaming."""
    bos, eos = boundary_token_ids(tokenizer)
    if bos is None or eos is None or tokenizer.pad_token_id is None:
        raise ValueError("The cloze model needs boundary tokens (bos/eos or cls/sep) and a pad token in the tokenizer.")
    room = args.max_seq_length - 2
    if room < 4:
        raise ValueError(f"max_seq_length={args.max_seq_length} is too short for a paragraph example.")

    def tokenize(batch):
        paragraphs = [p.strip() for text in batch["text"] for p in _PARAGRAPH_BREAK.split(text or "") if p.strip()]
        pieces = tokenizer(paragraphs, add_special_tokens=False)["input_ids"] if paragraphs else []
        return {"input_ids": [[bos, *ids[start : start + room], eos] for ids in pieces
                              for start in range(0, len(ids), room)]}

    return tokenize


class ClozeCollator:
    """Pads paragraph examples; every real token is a target except the leading boundary marker (nothing to its
    left or right would make it uncertain: it is always the same token)."""

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = 8):
        self.pad_token_id = tokenizer.pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        lengths = torch.tensor([len(example["input_ids"]) for example in examples])
        width = int(lengths.max())
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = torch.full((len(examples), width), self.pad_token_id, dtype=torch.long)
        for row, example in enumerate(examples):
            input_ids[row, : lengths[row]] = torch.as_tensor(example["input_ids"])
        attention_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        labels[:, 0] = -100
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def trained_losses(config: dict) -> tuple[str, ...]:
    """The losses a two-tower model of `config` returns: those its `loss_type` trains (cloze, bilm, or both)."""
    return tuple(f"{loss}_loss" for loss in config.get("loss_type", "cloze").split("+"))


# fairseq's language-model criterion (cross_entropy, behind the bi_trans_lm branch) sums the token losses and the
# trainer divides the gradients by the tokens of the whole update, gathered over the workers and --update-freq.
CLOZE_LOSS_WEIGHTING = LossWeighting(
    PER_UPDATE, "fairseq's LM criterion: summed token losses divided by the tokens of the whole update (every worker, "
    "every --update-freq batch); the bilm loss types, whose two directions the model averages, keep per-micro-batch "
    "means")


def unused_without_cloze_loss(values: dict) -> tuple[str, ...]:
    """Trained on its bilm loss alone, the model never runs its combination layer."""
    return ("cloze.combination",) if values.get("loss_type", "cloze") == "bilm" else ()


RECIPES = {
    "cloze": Recipe(
        name="cloze",
        family="cloze",
        summary="Two-tower cloze language model: a forward and a backward transformer tower combined by an attention "
        "layer that predicts every token from its full left and right context, never from itself.",
        sizes=CLOZE_SIZES,
        training_defaults=CLOZE_TRAINING,
        build_collator=lambda tokenizer, args: ClozeCollator(tokenizer),
        build_dataset=paragraph_examples,
        document_packer=paragraph_packer,
        logged_outputs=("cloze_loss", "bilm_loss"),
        logged_outputs_of=trained_losses,
        perplexity_of=("cloze_loss", "bilm_loss"),
        default_masking_scheme=None,
        paper=CLOZE_PAPER,
        hyperparameters=CLOZE_HYPERPARAMETERS,
        build_tokenizer=build_cloze_tokenizer,
        init_model=spell_word_vocabulary,
        loss_weighting=CLOZE_LOSS_WEIGHTING,
        unused_parameters_of=unused_without_cloze_loss,
    ),
}


def train_step_flops(kind: str, model, inputs: dict) -> int:
    """Model FLOPs of a train step of the two-tower cloze model with embedding inputs, the flat output layer and the
    cloze loss; raises ValueError for the settings it does not cover (adaptive softmax, character CNN, bilm loss)."""
    config = model.config
    if config.use_adaptive_softmax:
        raise ValueError("the model-FLOP count covers the flat output layer, not the adaptive softmax")
    if config.loss_type != "cloze":
        raise ValueError(f"the model-FLOP count covers loss_type 'cloze' only, not {config.loss_type!r}")
    if config.input_representation != "embedding":
        raise ValueError("the model-FLOP count covers embedding inputs, not the character CNN")
    tokens, squared, targets = step_sizes(inputs)
    d, ff, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    # Each tower's keys start with one zero state: a query attends over its length + 1.
    tower = layer(tokens, squared + tokens, d, ff)
    flops = 2 * config.num_hidden_layers * tower
    # Combination: queries at every token, keys/values = both towers' states (2 per token) plus the zero state.
    flops += dense(tokens, 2 * d, d) if config.query_combination == "concat" else 0
    flops += dense(tokens, d, d) + 2 * dense(2 * tokens, d, d) + dense(tokens, d, d)
    flops += attention(2 * squared + tokens, d) + dense(tokens, d, ff) + dense(tokens, ff, d)
    return flops + dense(targets, d, vocab)


# Cloze (Baevski et al.) Sec. 4: Adam, batch 16, 3 epochs, lr grid {1e-4, 5e-5, 3e-5}, warmup over the first 10% of
# steps then cosine annealing to 1e-6; no weight decay named (fairseq's default is 0). "We disable dropout in the
# language model and add 0.1 dropout between language model output and the final output projection" (`config`).
GLUE_PRESET = FineTuningPreset(
    flags=["--learning_rate", "5e-5", "--per_device_train_batch_size", "16", "--num_train_epochs", "3",
           "--warmup_steps", "0.1", "--lr_scheduler_type", "cosine_with_min_lr",
           "--lr_scheduler_kwargs", '{"min_lr": 1e-6}', "--weight_decay", "0.0"],
    config={"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "activation_dropout": 0.0,
            "classifier_dropout": 0.1},
)

COMMON_TEST_WIDTH = 16


def common_test_config(tester, **overrides):
    """A tiny cloze config for transformers' common tests, `COMMON_TEST_WIDTH` wide (its hidden states, which
    concatenate the two towers' states, twice that)."""
    from encoder_zoo import models

    return models.get_class("cloze", "AutoConfig")(
        vocab_size=tester.vocab_size, hidden_size=COMMON_TEST_WIDTH, num_hidden_layers=tester.num_hidden_layers,
        num_attention_heads=tester.num_attention_heads, intermediate_size=tester.intermediate_size,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2, sep_token_id=3, **overrides,
    )


def every_band_targets(input_ids, tester) -> dict:
    """Targets in every band of the adaptive softmax, which trains a band only on the targets that fall in it."""
    batch, length = input_ids.shape
    return {"labels": (torch.arange(batch * length).view(batch, length) * 7) % tester.vocab_size}


CLOZE_SKIPS = {
    "test_retain_grad_hidden_states_attentions": "by design each hidden state concatenates the two towers' states "
                                                 "after the fact (each tower reads its own half), so no gradient "
                                                 "flows into that concatenation; there are no attentions",
}
# By design the towers and the combination layer attend over a prepended zero state, and the model refuses
# output_attentions with a clear error instead of returning maps that do not match its inputs (has_attentions).
_CLOZE_COMMON_TESTS = dict(model_type="cloze", works_with_column="cloze",
                           pretraining_heads=("AutoModelForPreTraining", "AutoModelForMaskedLM"),
                           pretraining_labels=every_band_targets,
                           tester={"hidden_size": 2 * COMMON_TEST_WIDTH, "use_token_type_ids": False},
                           config_tester={"hidden_size": 37, "num_attention_heads": 1}, has_attentions=False)

FAMILY = Family(
    name="cloze",
    flops=FlopCount(kinds=("cloze",), choose=lambda model, inputs: "cloze", count=train_step_flops),
    glue_presets={"cloze": GLUE_PRESET},
    common_tests=(
        CommonTests(name="Cloze", config=common_test_config, skips=CLOZE_SKIPS, **_CLOZE_COMMON_TESTS),
        # The paper's CNN models: a character CNN spells each word, and an adaptive softmax predicts it.
        CommonTests(
            name="ClozeCharacterCnn",
            config=functools.partial(common_test_config, input_representation="char_cnn", use_adaptive_softmax=True,
                                     adaptive_softmax_cutoff=[10, 40], character_embedding_size=4,
                                     character_filters=[[1, 4], [2, 8]], max_word_characters=6),
            skips={
                **CLOZE_SKIPS,
                "test_model_get_set_embeddings": "no embedding matrix by design: a character CNN spells each word "
                                                 "from a saved word -> bytes table (set_input_embeddings refuses with "
                                                 "a clear error)",
                "test_resize_tokens_embeddings": "no embedding matrix to compare row by row: resize_token_embeddings "
                                                 "grows the word -> bytes table and the adaptive softmax "
                                                 "(test_cloze_model.py checks it)",
            },
            **_CLOZE_COMMON_TESTS,
        ),
    ),
    client_matrix=(
        ClientColumn("cloze", (FILL_MASK, PRETRAINING_HEAD, *ENCODER_CLIENTS), pretraining_export("cloze")),
    ),
)
