"""`--model bertac_cnn`: BERTAC's CNN, pretrained as the fake-entity generator F of a GAN (paper Section 3).

Data, word tokenizer and word vectors come from `training/data/bertac_pairs.py`; the alternating updates from
`training.trainer.GanTrainer`. Size presets are the nine released CNNs (`w123-f100` ... `w1234-f300`: filter
windows x filters per window, 300-d fastText words) plus `tiny` for tests.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch

from encoder_zoo.hub_cards.papers import BERTAC_PAPER
from encoder_zoo.training.data.bertac_pairs import (
    ENTITY_MASK,
    DamagedWordVectors,
    EntityPairCollator,
    article_sentences,
    embedding_table,
    encode_pairs,
    entity_masked_pairs,
    fasttext_vectors,
    frequent_word_coverage,
    load_article_pages,
    read_word_vectors,
    train_word_tokenizer,
)
from encoder_zoo.training.recipes import (
    ENCODER_CLIENTS,
    PRETRAINING_HEAD,
    TINY_EXPORT,
    ClientColumn,
    CommonTests,
    Family,
    FineTuningPreset,
    Recipe,
    TinyExport,
    TrainingDefaults,
    save_tiny_export,
)
from encoder_zoo.training.recipes.hire import common_test_backbone
from encoder_zoo.training.recipes.registry import PER_MICRO_BATCH, LossWeighting
from encoder_zoo.training.run.trainer import GanTrainer

logger = logging.getLogger(__name__)

WINDOW_SETS = ((1, 2, 3), (2, 3, 4), (1, 2, 3, 4))
BERTAC_CNN_SIZES = {
    "tiny": dict(filter_windows=[1, 2], num_filters=16, word_embedding_dim=32),
    **{
        f"w{''.join(map(str, windows))}-f{filters}": dict(filter_windows=list(windows), num_filters=filters,
                                                          word_embedding_dim=300)
        for windows in WINDOW_SETS
        for filters in (100, 200, 300)
    },
}


PAPER_HYPERPARAMETERS = {
    "data": "43.3M (entity mention, entity-masked sentence) pairs from Wikipedia (Sept. 2020) links; 10% (4.33M) used",
    "word embeddings": "fastText, 300-d, 2.5M words, frozen",
    "optimizer": "RMSProp, learning rate 2e-4 (no other setting named)",
    "batch / epochs": "4,000 pairs in all, 200 epochs (1,084 steps each)",
    "networks": "R and F: CNNs (windows {1,2,3}, {2,3,4} or {1,2,3,4} x 100/200/300 filters, He init); D: logistic "
                "regression",
}

# Section 3: RMSProp at 2e-4, batch 4,000, 200 epochs of the 4.33M pairs (about 1,084 steps each); the paper names
# no schedule, weight decay or clipping, so none is used. Every size trains alike. RMSProp's other settings are
# torch.optim.RMSprop's defaults, spelled out: the authors trained in PyTorch (the released CNNs are torch.save'd
# PyTorch `Generator` state dicts with torchtext vocabularies, and their cnn_utils.py maps "rmsprop" to
# torch.optim.RMSprop), not TensorFlow, whose RMSprop has rho 0.9 and eps 1e-7 (TF1: decay 0.9, epsilon 1e-10).
BERTAC_CNN_TRAINING = TrainingDefaults(
    size="w123-f100",
    source="BERTAC Sec. 3; RMSprop's alpha/eps: torch's defaults, as in the authors' PyTorch code",
    learning_rate=2e-4,
    warmup_steps=0,
    total_steps=216_800,
    optim="rmsprop",
    optim_args="alpha=0.99,eps=1e-08,momentum=0,centered=False",
    lr_scheduler_type="constant",
    weight_decay=0.0,
    max_grad_norm=0.0,
    batch_size=4000,  # pairs in all, split over the processes
    batch_without_accumulation=True,  # GanTrainer takes two updates per batch, so it cannot accumulate
    max_seq_length=128,
)

LOGGED = ("d_loss", "f_loss", "mse_loss", "d_accuracy_real", "d_accuracy_fake", "real_norm", "fake_norm",
          "cosine_related", "cosine_unrelated")


def load_pages(args):
    return load_article_pages(args.dataset, args.max_documents, args.preprocessing_num_workers)


def pairs_of(pages, args):
    """The (mention, masked sentence) pairs of some pages; `datasets` caches them, so each stage reuses them."""
    return entity_masked_pairs(pages, seed=args.masking_seed, num_proc=args.preprocessing_num_workers)


def build_word_tokenizer(pages, args, config_kwargs):
    pairs = pairs_of(pages, args)
    logger.info("Building the CNN word vocabulary (at most %d words) from %d pair sentences", args.tokenizer_vocab_size,
                len(pairs))
    sentences = (text for batch in pairs.select_columns(["sentence"]).iter(batch_size=1000)
                 for text in batch["sentence"])
    return train_word_tokenizer(sentences, vocab_size=args.tokenizer_vocab_size, model_max_length=args.max_seq_length)


def build_pair_dataset(pages, tokenizer, args):
    if tokenizer.mask_token != ENTITY_MASK:
        raise ValueError(f"--model bertac_cnn needs a CNN word tokenizer with {ENTITY_MASK} as its mask token (e.g. an "
                         "earlier bertac_cnn export); drop --tokenizer_name to build one from the pairs.")
    return encode_pairs(pairs_of(pages, args), tokenizer, args.max_seq_length, num_proc=args.preprocessing_num_workers)


def load_word_vectors(model, tokenizer, pages, args, training_args) -> None:
    """Fill the frozen word table: the user's `--word_vectors`, else fastText trained on the pages' sentences and
    cached in OUTPUT_DIR/word_vectors (a resumed run reuses them; its checkpoint holds the table anyway). A damaged
    cache is trained again; a damaged or poorly matching user file is refused, naming it."""
    dim = model.config.word_embedding_dim
    wanted = set(tokenizer.get_vocab())

    def train_vectors():
        return fasttext_vectors(article_sentences(pages, args.preprocessing_num_workers), dim,
                                Path(training_args.output_dir) / "word_vectors", threads=args.word_vector_threads)

    path = args.word_vectors or train_vectors()
    try:
        vectors = read_word_vectors(path, wanted)
    except DamagedWordVectors as damage:
        if args.word_vectors:
            raise
        logger.warning("The cached fastText vectors %s are damaged (%s): training them again.", path, damage.problem)
        Path(path).unlink()
        path = train_vectors()
        vectors = read_word_vectors(path, wanted)
    if args.word_vectors:
        check_coverage(tokenizer, vectors, args)
    table, found = embedding_table(tokenizer, vectors, dim, seed=training_args.seed)
    model.get_input_embeddings().weight.copy_(table)
    source = ('`' + str(args.word_vectors) + '`' if args.word_vectors
              else f"fastText trained on the pretraining sentences ({dim}-d skipgram)")
    args.word_vector_summary = f"{found} of {len(tokenizer)} CNN words from {source}; the others U(-0.1, 0.1); frozen"
    logger.info("Word vectors: %s", args.word_vector_summary)


def check_coverage(tokenizer, vectors, args) -> None:
    """Refuse `--word_vectors` that miss most of the CNN's frequent words. A file in the corpus's language under the
    one word rule (lowercased, accents stripped; cased files serve too) covers nearly all of the 1,000 most frequent
    words, whose vectors the CNN reads most; under half means another language or word rule, or a damaged file, and
    the CNN would read mostly random vectors. (Over the whole vocabulary coverage is no measure: fastText itself
    keeps only words seen 3 times, under half of a Wikipedia vocabulary.)"""
    covered, frequent = frequent_word_coverage(tokenizer, vectors)
    minimum = getattr(args, "min_word_vector_coverage", 0.5)
    if frequent and covered < minimum * frequent:
        raise ValueError(
            f"--word_vectors {args.word_vectors} covers {covered} of the {frequent} most frequent CNN words "
            f"({covered / frequent:.0%}; {len(vectors)} of {len(tokenizer)} words in all), under "
            f"--min_word_vector_coverage {minimum:g}: is it in this corpus's language, with words as the CNN splits "
            "them (lowercased, accents stripped), and whole? Pass vectors that match, drop --word_vectors to train "
            "them on the pretraining sentences, or pass --min_word_vector_coverage 0 to train with random vectors "
            "for the words it lacks.")


def batch_text(training_args) -> str:
    """The card's batch row: the global batch of pairs and how the processes share it (no accumulation)."""
    per_device, processes = training_args.per_device_train_batch_size, training_args.world_size
    return (f"{per_device * processes} pairs in all ({per_device} per process x {processes} "
            f"process{'es' if processes > 1 else ''}), each batch giving two updates (D and R, then F)")


def describe_training(trainer, args) -> dict:
    last = next((entry for entry in reversed(trainer.state.log_history)
                 if "d_accuracy_real" in entry or "mse_loss" in entry), {})
    rows = {
        "examples": f"{trainer.train_dataset.num_rows} (entity mention, masked sentence) pairs, one wikilink mention "
        "per sentence replaced whole by [EM]",
        "masking": "none (the mention is removed from the sentence, not masked for prediction)",
        "max sequence length": f"{args.max_seq_length} words",
        "batch": batch_text(trainer.args),
        "word vectors": getattr(args, "word_vector_summary", "loaded with the checkpoint"),
        "objective": f"{trainer.model.config.pretraining_objective}, F loss {trainer.model.config.generator_loss}",
    }
    for key in ("d_loss", "f_loss", "mse_loss", "d_accuracy_real", "d_accuracy_fake", "cosine_related",
                "cosine_unrelated"):
        if key in last:
            rows[f"final {key}"] = last[key]
    return rows


RECIPES = {
    "bertac_cnn": Recipe(
        name="bertac_cnn",
        family="bertac_cnn",
        summary="BERTAC's CNN: frozen fastText words -> projection -> convolutions -> masked average pooling, "
        "pretrained as the fake-entity generator F of a GAN (Algorithm 1): from a Wikipedia sentence whose linked "
        "entity mention is replaced by [EM], F must produce a vector that a logistic-regression discriminator D "
        "cannot tell from the vector a second CNN R makes of the mention itself. sentence-transformers encodes with "
        "it through the wrapper in encoder-zoo's docs/clients.md (one module reading its pooler_output; no pooling "
        "layer).",
        sizes=BERTAC_CNN_SIZES,
        build_collator=lambda tokenizer, args: EntityPairCollator(tokenizer.pad_token_id),
        build_dataset=build_pair_dataset,
        logged_outputs=LOGGED,
        paper=BERTAC_PAPER,
        hyperparameters=PAPER_HYPERPARAMETERS,
        # tiny (not in the paper) keeps the optimiser, not the paper's batch and length, as other recipes' smoke sizes.
        training_defaults={size: BERTAC_CNN_TRAINING if size == "tiny" else replace(BERTAC_CNN_TRAINING, size=size)
                           for size in BERTAC_CNN_SIZES},
        flag_defaults={
            "model_size": "w123-f100",
            "per_device_eval_batch_size": 4000,
            "num_train_epochs": 200,
            "tokenizer_vocab_size": 200_000,
        },
        load_corpus=load_pages,
        corpus_description="the embedded real English Wikipedia XML excerpt (106 articles with their internal links, "
        "shipped by gensim; CC BY-SA)",
        build_tokenizer=build_word_tokenizer,
        init_model=load_word_vectors,
        trainer_class=GanTrainer,
        describe_training=describe_training,
        card_plots={
            "collapse_signal.png": ("cosine_related", "cosine_unrelated"),
            "discriminator_accuracy.png": ("d_accuracy_real", "d_accuracy_fake"),
            "representation_norms.png": ("real_norm", "fake_norm"),
        },
        # The GAN pretraining code was never released: Algorithm 1 averages each loss over a minibatch of pairs, and
        # GanTrainer takes no accumulation, so every process's mean weighs the same number of pairs.
        loss_weighting=LossWeighting(PER_MICRO_BATCH, "not released; BERTAC's Algorithm 1 averages each loss over a "
                                     "minibatch of pairs (no accumulation: per-process means of equal-size batches, "
                                     "averaged over the processes)"),
        # Each GAN call trains only some networks: D and R's step leaves F (`cnn`) out, F's step leaves R and D out.
        unused_parameters=("cnn", "real_encoder", "discriminator"),
    ),
}


# BERTAC Sec. 5.1.1 / Table 9: lr grid {8e-6, 9e-6, 1e-5, 2e-5, 3e-5}, 6% warmup then linear decay, length 128, batch
# 16 (128 for MNLI and QQP: pass --per_device_train_batch_size), epochs 6-10 (1-5 for MNLI, QQP, QNLI). The authors'
# run_glue.py: AdamW, eps 1e-8, weight decay 0.01, clipping 1.0. We take 1e-5 and 8 (3) epochs.
GLUE_PRESET = FineTuningPreset(
    flags=["--learning_rate", "1e-5", "--warmup_steps", "0.06", "--lr_scheduler_type", "linear", "--adam_epsilon",
           "1e-8", "--weight_decay", "0.01", "--max_grad_norm", "1.0", "--per_device_train_batch_size", "16",
           "--num_train_epochs", "8", "--max_seq_length", "128"],
    epochs_by_task={task: "3" for task in ("mnli", "qqp", "qnli")},
)


def common_test_cnn_config(tester):
    """A tiny BERTAC CNN config for transformers' common tests."""
    from encoder_zoo import models

    return models.get_class("bertac_cnn", "AutoConfig")(vocab_size=tester.vocab_size, word_embedding_dim=8,
                                                        filter_windows=[1, 2], num_filters=4, mask_token_id=3)


def common_test_config(tester):
    """A tiny BERTAC config (a BERT encoder, a 20-word CNN, two TIER layers) for transformers' common tests."""
    from encoder_zoo import models

    cnn = models.get_class("bertac_cnn", "AutoConfig")(vocab_size=20, word_embedding_dim=8, filter_windows=[1, 2],
                                                       num_filters=4, mask_token_id=3)
    return models.get_class("bertac", "AutoConfig")(
        backbone_config=common_test_backbone(tester), cnn_config=cnn.to_dict(), num_tier_layers=2,
        separator_token_ids=[1, 2], word_lookup_size=4, backbone_vocab_size=tester.vocab_size,
        num_labels=tester.num_labels)


def entity_targets(input_ids, tester) -> dict:
    """Fixed real words (no [PAD]): both calls of a comparison get the same mentions."""
    return {"entity_ids": torch.arange(tester.batch_size * 3).view(-1, 3) % (tester.vocab_size - 4) + 4}


def tiny_export(folder: Path, tokenizer) -> TinyExport:
    """The client matrix's BERTAC: a tiny random classifier over a tiny random BERT and a tiny random part-1 CNN export
    (with a word tokenizer of a few sentences' words), which is what `AutoModelForPreTraining` loads."""
    from transformers import BertConfig, BertModel

    from encoder_zoo import models

    encoder = save_tiny_export(BertModel(BertConfig(vocab_size=len(tokenizer), **TINY_EXPORT)), folder / "encoder",
                               tokenizer).folder
    words = train_word_tokenizer(["The quick brown fox jumps over the lazy dog.", "A short second sentence.",
                                  "The airport replaced the old one as the main hub."], vocab_size=100)
    cnn_config = models.get_class("bertac_cnn", "AutoConfig")(
        vocab_size=len(words), pad_token_id=words.pad_token_id, mask_token_id=words.mask_token_id,
        **BERTAC_CNN_SIZES["tiny"])
    cnn = save_tiny_export(models.get_class("bertac_cnn", "AutoModelForPreTraining")(cnn_config), folder / "cnn",
                           words).folder
    model = models.get_class("bertac", "AutoModelForSequenceClassification").from_pretrained_parts(
        str(encoder), str(cnn), num_labels=2)
    return TinyExport(save_tiny_export(model, folder / "export", tokenizer).folder, pretraining=cnn)


RANDOM_WORD_TABLE = ("the frozen word table is a buffer initialised at random by design (the authors' U(-0.1, 0.1) "
                     "for words without a fastText vector), so it cannot equal its zero __init__ value")

FAMILY = Family(
    name="bertac",
    flops=None,  # no formula for the CNN's GAN steps: its runs sum Trainer's estimate
    glue_presets={"bertac": GLUE_PRESET},
    common_tests=(
        CommonTests(
            name="Bertac", model_type="bertac", config=common_test_config, works_with_column="bertac",
            config_tester={"has_text_modality": False},
            # BertacModel returns two kinds of hidden states (the encoder's and the TIER layers'), the heads one.
            hidden_states_types={"AutoModel": 2},
            skips={
                "test_init_weights_can_init_buffers": RANDOM_WORD_TABLE,
                "test_inputs_embeds": "by design: BERTAC rebuilds its CNN's words from input_ids (inputs_embeds "
                                      "cannot be mapped to words) and refuses inputs_embeds alone with a clear error",
            },
        ),
        CommonTests(
            name="BertacCnn", model_type="bertac_cnn", config=common_test_cnn_config, works_with_column="bertac",
            pretraining_heads=("AutoModelForPreTraining",), pretraining_labels=entity_targets,
            tester={"use_token_type_ids": False}, config_tester={"common_properties": []}, has_attentions=False,
            skips={
                "test_init_weights_can_init_buffers": RANDOM_WORD_TABLE,
                "test_hidden_states_output": "no hidden states by design: a one-layer CNN pooled over time (its "
                                             "output is one vector)",
                "test_retain_grad_hidden_states_attentions": "no hidden states or attentions by design (a CNN pooled "
                                                             "over time)",
                "test_feed_forward_chunking": "no feed-forward block to chunk (a CNN)",
                "test_model_get_set_embeddings": "the word table is a frozen buffer by design (BertacWordEmbeddings, "
                                                 "never in an optimizer), not an nn.Embedding",
            },
        ),
    ),
    # No masked-LM head; the pretraining head is the part-1 CNN's (the GAN's F and D).
    client_matrix=(ClientColumn("bertac", (PRETRAINING_HEAD, *ENCODER_CLIENTS), tiny_export),),
)
