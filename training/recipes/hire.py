"""HIRE: no pretraining recipe (it fine-tunes a pretrained encoder, `glue/init_hire.py`), so no `RECIPES`; what the
family declares lives here as every family's does."""

from __future__ import annotations

from encoder_zoo.training.recipes import (
    ENCODER_CLIENTS,
    TINY_EXPORT,
    ClientColumn,
    CommonTests,
    Family,
    FineTuningPreset,
    save_tiny_export,
)

# HIRE App. A.2: Adam (beta2 0.98, eps 1e-6), lr {1e-5, 2e-5}, warmup 6%, "L2 weight decay" 0.1, gradient norm clipped
# at 1, batch {16, 32, 48}, 3 to 27 epochs with early stopping, max length 128. We take 1e-5, batch 32 and at most 10
# epochs (RoBERTa-large's usual GLUE setting, the encoder HIRE extends), evaluate every epoch, stop after 3 epochs
# without a better development score (the paper gives no patience) and keep the best checkpoint; decay is linear, as
# RoBERTa's. The 0.1 is AdamW's decoupled decay, as in the Transformers GLUE example the authors built on and in
# RoBERTa's recipe: L2 at 0.1 through Adam (--weight_decay_type l2, the text read literally) pulls every weight
# towards 0 by up to lr per step (docs/models/hire.md gives the measured sizes).
GLUE_PRESET = FineTuningPreset(
    flags=["--learning_rate", "1e-5", "--adam_beta1", "0.9", "--adam_beta2", "0.98", "--adam_epsilon", "1e-6",
           "--warmup_steps", "0.06", "--lr_scheduler_type", "linear", "--weight_decay", "0.1", "--max_grad_norm",
           "1.0", "--per_device_train_batch_size", "32", "--num_train_epochs", "10", "--max_seq_length", "128",
           "--early_stopping_patience", "3"],
    note="at most 10 epochs with --early_stopping_patience 3 and the best epoch kept (the paper: 3-27 epochs with "
    "early stopping); its weight decay 0.1 is AdamW's decoupled decay (--weight_decay_type l2 reads the paper's "
    "'L2 weight decay' literally; docs/models/hire.md).",
)


def common_test_backbone(tester):
    """A tiny BERT encoder config (as a dict) for the fusion models' common tests (HIRE's, BERTAC's)."""
    from transformers import BertConfig

    return BertConfig(vocab_size=tester.vocab_size, hidden_size=tester.hidden_size,
                      num_hidden_layers=tester.num_hidden_layers, num_attention_heads=tester.num_attention_heads,
                      intermediate_size=tester.intermediate_size, type_vocab_size=tester.type_vocab_size,
                      max_position_embeddings=64).to_dict()


def common_test_config(tester):
    """A tiny HIRE config for transformers' common tests."""
    from encoder_zoo import models

    return models.get_class("hire", "AutoConfig")(backbone_config=common_test_backbone(tester), gru_hidden_size=8,
                                                  num_labels=tester.num_labels)


def tiny_export(folder, tokenizer):
    """A tiny random HIRE classifier over a tiny random BERT encoder (the client matrix's export)."""
    from transformers import BertConfig

    from encoder_zoo import models

    config = models.get_class("hire", "AutoConfig")(
        backbone_config=BertConfig(vocab_size=len(tokenizer), **TINY_EXPORT).to_dict(), num_labels=2, gru_hidden_size=8)
    return save_tiny_export(models.get_class("hire", "AutoModelForSequenceClassification")(config), folder, tokenizer)


FAMILY = Family(
    name="hire",
    flops=None,  # fine-tuned only: no pretraining step to count
    glue_presets={"hire": GLUE_PRESET},
    common_tests=(
        CommonTests(
            name="Hire", model_type="hire", config=common_test_config, works_with_column="hire",
            config_tester={"has_text_modality": False},
            skips={
                "test_retain_grad_hidden_states_attentions": "by design HIRE runs its encoder right-aligned whatever "
                                                             "the caller's padding, and returns the encoder's hidden "
                                                             "states and attentions reordered to the caller's layout: "
                                                             "copies, off the loss's graph",
            },
        ),
    ),
    # No masked-LM or pretraining head: HIRE is built over a pretrained encoder.
    client_matrix=(ClientColumn("hire", ENCODER_CLIENTS, tiny_export),),
)
