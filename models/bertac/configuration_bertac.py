"""BERTAC configurations (Oh et al., 2021, "BERTAC: Enhancing Transformer-based Language Models with Adversarially
Pretrained Convolutional Neural Networks").

This folder holds two model types: `bertac_cnn`, the GAN-pretrained CNN of Section 3 (this file's
`BertacCnnConfig`), and BERTAC itself, the CNN fused into a transformer through TIER layers (Section 4).
"""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

# One auto_map per model type of this folder, written into every saved config.json (save_pretrained records only
# the class being saved, and one export must load through every Auto class). models/__init__.py registers the local
# classes from these same maps.
AUTO_MAPS = {
    "bertac_cnn": {
        "AutoConfig": "configuration_bertac.BertacCnnConfig",
        "AutoModel": "modeling_bertac.BertacCnnModel",
        "AutoModelForPreTraining": "modeling_bertac.BertacCnnForPreTraining",
    },
}

PRETRAINING_OBJECTIVES = ("gan", "self_supervised")
GENERATOR_LOSSES = ("minimax", "non_saturating")


@strict
class BertacCnnConfig(PreTrainedConfig):
    r"""
    Configuration of BERTAC's CNN (paper Section 3) and of its GAN pretraining.

    The CNN maps a word sequence to one vector: frozen word embeddings (fastText, `word_embedding_dim` wide) ->
    bias-free `Linear(dw -> dw)` + leaky ReLU -> one `Conv1d(dw -> num_filters, width w, padding w - 1)` + leaky
    ReLU per window width `w` in `filter_windows` -> average over the positions that hold a word -> concatenation, so
    the output has `len(filter_windows) * num_filters` features. Pretraining trains two such CNNs with separate
    weights, R (reads an entity mention e) and F (reads its sentence m with the mention replaced by `[EM]`), and a
    logistic-regression discriminator D on one representation (Algorithm 1). F is the CNN that BERTAC keeps.

    Args:
        vocab_size: Number of CNN words (rows of the frozen embedding table), specials included.
        word_embedding_dim: dw, the width of the word embeddings (300 fastText dimensions in the paper).
        filter_windows: Convolution window widths; the released CNNs use (1, 2, 3), (2, 3, 4) or (1, 2, 3, 4).
        num_filters: Filters per window width (100, 200 or 300 in the released CNNs).
        leaky_relu_slope: Negative slope of every leaky ReLU (torch's default; neither the paper nor the released
            code states another).
        projection_initializer_std: Std of the N(0, std) init of the bias-free word projection (0.1, as in the
            authors' `Generator`). Convolutions use He init, as the paper says.
        initializer_range: Std of the N(0, std) init of the self-supervised projection. (D, the logistic regression,
            starts at zero: undecided. The paper says neither.)
        pad_token_id: Id of `[PAD]`, whose embedding row is zero.
        mask_token_id: Id of `[EM]`, the token that replaces the entity mention.
        pretraining_objective: "gan" (Algorithm 1) or "self_supervised" (Tables 4 and 8: F regresses the mean word
            embedding of the entity with MSE, through a `Linear(len(filter_windows) * num_filters -> dw)`
            projection; no R and no D).
        generator_loss: F's loss. "minimax" descends `log(1 - D(F(m)))` as Algorithm 1 does; "non_saturating"
            descends `-log D(F(m))`, the usual GAN fix for gradients that vanish once D wins (not in the paper).
    """

    model_type = "bertac_cnn"

    vocab_size: int = 30000
    word_embedding_dim: int = 300
    filter_windows: list[int] | tuple[int, ...] = (1, 2, 3)
    num_filters: int = 100
    leaky_relu_slope: float = 0.01
    projection_initializer_std: float = 0.1
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    mask_token_id: int | None = None
    pretraining_objective: str = "gan"
    generator_loss: str = "minimax"

    def __post_init__(self, **kwargs):
        kwargs.setdefault("auto_map", dict(AUTO_MAPS["bertac_cnn"]))
        self.filter_windows = [int(w) for w in self.filter_windows]
        super().__post_init__(**kwargs)
        for name, choices in (("pretraining_objective", PRETRAINING_OBJECTIVES), ("generator_loss", GENERATOR_LOSSES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"BertacCnnConfig.{name}={getattr(self, name)!r}; choose one of {', '.join(choices)}.")
        if not self.filter_windows or min(self.filter_windows) < 1:
            raise ValueError(f"filter_windows must be positive widths, got {self.filter_windows}.")
        if self.pad_token_id is None:
            raise ValueError("BertacCnnConfig needs pad_token_id: the pad row of the embedding table is zero.")

    @property
    def output_size(self) -> int:
        """de, the width of the CNN's vector: one `num_filters` block per window width."""
        return len(self.filter_windows) * self.num_filters


__all__ = ["BertacCnnConfig", "AUTO_MAPS"]
