"""BERTAC configurations (Oh et al., 2021, "BERTAC: Enhancing Transformer-based Language Models with Adversarially
Pretrained Convolutional Neural Networks").

This folder holds two model types: `bertac_cnn`, the GAN-pretrained CNN of Section 3 (`BertacCnnConfig`), and
`bertac`, the CNN fused into any transformer encoder through TIER layers (Section 4, `BertacConfig`).
"""

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, BertConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .bertac_backbone import BACKBONE_CLASSES

# One auto_map per model type of this folder, written into every saved config.json (save_pretrained records only
# the class being saved, and one export must load through every Auto class). models/__init__.py registers the local
# classes from these same maps.
AUTO_MAPS = {
    "bertac_cnn": {
        "AutoConfig": "configuration_bertac.BertacCnnConfig",
        "AutoModel": "modeling_bertac.BertacCnnModel",
        "AutoModelForPreTraining": "modeling_bertac.BertacCnnForPreTraining",
    },
    "bertac": {
        "AutoConfig": "configuration_bertac.BertacConfig",
        "AutoModel": "modeling_bertac.BertacModel",
        "AutoModelForSequenceClassification": "modeling_bertac.BertacForSequenceClassification",
        "AutoModelForQuestionAnswering": "modeling_bertac.BertacForQuestionAnswering",
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

    @property
    def hidden_size(self) -> int:
        """The width of the CNN's one output, its vector (`output_size`; the CNN keeps no per-word hidden states):
        where sentence-transformers and other clients read a model's embedding width."""
        return self.output_size


@strict
class BertacConfig(PreTrainedConfig):
    r"""
    BERTAC (paper Section 4): a pretrained transformer encoder runs in full, then `num_tier_layers` TIER layers stack
    on its last layer. Each TIER layer is a transformer layer whose attention queries come from the CNN's vectors of
    the input's segments (one per sentence, or per question and passage) and whose keys and values come from the
    token states; between TIER layers the CNN's input word embeddings are updated (bilinear attention + highway gate).

    Build one from pretrained parts with `BertacForSequenceClassification.from_pretrained_parts(backbone=..., cnn=...)`
    (or `glue/init_bertac.py`); that also fills the word lookup tables this config sizes.

    Args:
        backbone_config: Config of the encoder (any `AutoConfig`; ALBERT-xxlarge-v2 and RoBERTa-large in the paper).
            The encoder may be remote code (a zoo model such as SpanBERT, or any `trust_remote_code` encoder):
            `save_pretrained` then copies its modeling files next to BERTAC's (see `bertac_backbone.py`), so the
            checkpoint loads anywhere.
        cnn_config: Config of the CNN (`BertacCnnConfig`, a `bertac_cnn` export's). Its pretraining objective is
            recorded: a `self_supervised` CNN is the "w/o GAN-style CNN" ablation (Tables 4 and 8).
        num_tier_layers: TIER layers stacked on the encoder (3 in the paper for GLUE and QA).
        tier_hidden_size: Width of the TIER layers. `None` keeps the encoder's width (RoBERTa-large in the paper);
            another width adds `Linear(encoder -> TIER)` before the first TIER and `Linear(TIER -> encoder)` after the
            last (the paper's ALBERT-xxlarge: 4096 -> 1024 -> 4096).
        tier_num_attention_heads: Heads of the TIER attention (`None`: the encoder's; 64 over ALBERT-xxlarge).
        tier_intermediate_size: FFN width of a TIER layer (`None`: the encoder's when the width is the encoder's, else
            4x the TIER width; 4096 over ALBERT-xxlarge).
        tier_hidden_act: FFN activation (`None`: the encoder's).
        tier_hidden_dropout_prob: Dropout after the TIER attention and FFN (`None`: the encoder's).
        tier_attention_probs_dropout_prob: Dropout on the TIER attention probabilities (`None`: the encoder's).
        tier_layer_norm_eps: LayerNorm epsilon of the TIER layers (`None`: the encoder's).
        update_cnn_input: Update the CNN's input embeddings between TIER layers (bilinear attention over the words
            w.r.t. the CNN vector, then a highway gate). `False` is the "w/o update" ablation (Table 8): every TIER
            layer reads F(m^1).
        use_cnn_and_tier: `False` is the "w/o CNN and TIER" ablation (Table 8): the encoder alone with the same head,
            on the same code path (no CNN, no TIER, no lookup tables).
        cnn_trainable: Train the CNN's weights with the rest (the "randomly initialized CNN" ablation of Table 4,
            built with `from_pretrained_parts(..., cnn_weights="random")`). The word embedding table stays frozen in
            every setting; by default the CNN is frozen too, as in the paper.
        detach_cnn_output: Detach the CNN's vectors from the graph, as the authors' released code does. Then no
            gradient reaches the input-update layers, which stay at their initialisation; the paper says they train,
            so the default (`False`) lets the gradient flow through the frozen CNN into them.
        max_segments: Segments that get a CNN vector: 1 (single sentences) or 2 (pairs, question + passage; the
            paper's u <= 2). Segments are the runs of tokens between the encoder's special tokens.
        separator_token_ids: The encoder's special tokens that delimit segments ([CLS], [SEP], <s>, </s>, pad).
        word_lookup_size: Entries of the table that maps an encoder word (its sequence of pieces) to a CNN word id.
        backbone_vocab_size: Rows of the per-piece word-boundary table (the encoder tokenizer's vocabulary).
        cnn_unknown_word_id: CNN word id of encoder words the table does not hold (the CNN tokenizer's `[UNK]`).
        classifier_dropout: Dropout before the output layer of the sequence classifier (`None`: the encoder's
            `classifier_dropout_prob`, `classifier_dropout` or `hidden_dropout_prob`, the first it has).
        initializer_range: Std of the N(0, std) init of the TIER, update and head weights (the encoder's init; the
            paper says the TIER layers start random).
    """

    model_type = "bertac"
    sub_configs_defaults = {
        "backbone_config": SubConfigSpec(config_class=AutoConfig, model_type="bert"),
        # [EM] is id 2 in every bertac_cnn export's word tokenizer ([PAD] 0, [UNK] 1, [EM] 2).
        "cnn_config": SubConfigSpec(config_class=BertacCnnConfig, init_kwargs={"mask_token_id": 2}),
    }

    backbone_config: dict | PreTrainedConfig | None = None
    cnn_config: dict | BertacCnnConfig | None = None
    num_tier_layers: int = 3
    tier_hidden_size: int | None = None
    tier_num_attention_heads: int | None = None
    tier_intermediate_size: int | None = None
    tier_hidden_act: str | None = None
    tier_hidden_dropout_prob: float | None = None
    tier_attention_probs_dropout_prob: float | None = None
    tier_layer_norm_eps: float | None = None
    update_cnn_input: bool = True
    use_cnn_and_tier: bool = True
    cnn_trainable: bool = False
    detach_cnn_output: bool = False
    max_segments: int = 2
    separator_token_ids: list[int] | tuple[int, ...] = ()
    word_lookup_size: int = 0
    backbone_vocab_size: int = 0
    cnn_unknown_word_id: int = 1
    classifier_dropout: float | None = None
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        kwargs.setdefault("auto_map", dict(AUTO_MAPS["bertac"]))
        self.separator_token_ids = [int(i) for i in self.separator_token_ids]
        if isinstance(self.backbone_config, dict):
            self.backbone_config = self._backbone_from_dict(self.backbone_config)
        super().__post_init__(**kwargs)
        if self.use_cnn_and_tier and self.num_tier_layers < 1:
            raise ValueError(f"num_tier_layers={self.num_tier_layers}: BERTAC needs at least one TIER layer "
                             "(use_cnn_and_tier=False is the encoder alone).")
        if self.max_segments not in (1, 2):
            raise ValueError(f"max_segments={self.max_segments}; BERTAC reads one or two segments (the paper's u).")
        if self.cnn_trainable and self.detach_cnn_output:
            raise ValueError("cnn_trainable=True trains the CNN through its output; it cannot go with "
                             "detach_cnn_output=True.")
        if self.use_cnn_and_tier:
            self._check_cnn_special_ids()
        width, heads = self.tier_width, self.tier_layer_config().num_attention_heads
        if width % heads:
            raise ValueError(f"tier_hidden_size {width} is not a multiple of tier_num_attention_heads {heads}.")

    def _check_cnn_special_ids(self) -> None:
        """The word lookup writes the CNN's [PAD] id where a segment has no more words and its [EM] id for the masked
        noun phrase: both must be rows of the CNN's word table."""
        cnn = self.cnn_config
        for name, token in (("pad_token_id", "[PAD]"), ("mask_token_id", "[EM]")):
            value = getattr(cnn, name)
            if value is None or not 0 <= value < cnn.vocab_size:
                raise ValueError(
                    f"BertacConfig.cnn_config.{name} is {value!r}: BERTAC's word lookup needs the CNN's {token} id, a "
                    f"row of its {cnn.vocab_size}-word table. Set cnn_config.{name} (a `bertac_cnn` export's config "
                    "has it: build from one with from_pretrained_parts or glue/init_bertac.py)."
                )

    # Copied from models.hire.configuration_hire.HireConfig._backbone_from_dict with HIRE->BERTAC,RoBERTa->BERT
    @staticmethod
    def _backbone_from_dict(backbone: dict) -> PreTrainedConfig | dict:
        """An encoder saved with this checkpoint's code first, then any encoder transformers knows (built in, or
        registered in this process); a dict without `model_type` is left to the BERT default."""
        model_type = backbone.get("model_type")
        if model_type in BACKBONE_CLASSES:
            return BACKBONE_CLASSES[model_type][0].from_dict(backbone)
        if model_type is not None and model_type not in CONFIG_MAPPING:
            raise ValueError(
                f"backbone_config has model_type {model_type!r}, which transformers does not know and this checkpoint "
                "carries no code for. Register the encoder's classes (e.g. `import encoder_zoo.models`) or load it "
                "with trust_remote_code=True before building BERTAC, and save BERTAC again: its code then travels with "
                "it."
            )
        return backbone

    def get_text_config(self, decoder=None, encoder=None) -> PreTrainedConfig:
        """The encoder's config: where transformers, PEFT and other clients read the text model's sizes
        (`vocab_size`, `hidden_size`, ...), and where `resize_token_embeddings` records the new vocabulary size. (The
        CNN reads its own word vocabulary, rebuilt from the encoder's pieces inside the model.)"""
        return self.backbone_config

    @property
    def backbone_hidden_size(self) -> int:
        return self.backbone_config.hidden_size

    @property
    def tier_width(self) -> int:
        return self.tier_hidden_size or self.backbone_hidden_size

    def _backbone_value(self, *names, default=None):
        for name in names:
            value = getattr(self.backbone_config, name, None)
            if value is not None:
                return value
        return default

    @property
    def head_dropout(self) -> float:
        if self.classifier_dropout is not None:
            return self.classifier_dropout
        return self._backbone_value("classifier_dropout_prob", "classifier_dropout", "hidden_dropout_prob", default=0.1)

    def tier_layer_config(self) -> BertConfig:
        """The settings of one TIER layer as the `BertConfig` that transformers' BERT blocks read."""
        width = self.tier_width
        same_width = width == self.backbone_hidden_size
        intermediate = self.tier_intermediate_size or (
            self._backbone_value("intermediate_size", "hidden_dim", default=4 * width) if same_width else 4 * width)
        return BertConfig(
            hidden_size=width,
            num_attention_heads=self.tier_num_attention_heads or self._backbone_value("num_attention_heads", default=1),
            intermediate_size=intermediate,
            hidden_act=self.tier_hidden_act or self._backbone_value("hidden_act", "activation", default="gelu"),
            hidden_dropout_prob=self._first(
                self.tier_hidden_dropout_prob,
                self._backbone_value("hidden_dropout_prob", "dropout", default=0.1)),
            attention_probs_dropout_prob=self._first(
                self.tier_attention_probs_dropout_prob,
                self._backbone_value("attention_probs_dropout_prob", "attention_dropout", default=0.1)),
            layer_norm_eps=self._first(self.tier_layer_norm_eps, self._backbone_value("layer_norm_eps", default=1e-12)),
            initializer_range=self.initializer_range,
        )

    @staticmethod
    def _first(value, fallback):
        return fallback if value is None else value


__all__ = ["BertacCnnConfig", "BertacConfig", "AUTO_MAPS"]
