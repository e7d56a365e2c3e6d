"""TEAMS configuration (Shen et al., 2021, "Training ELECTRA Augmented with Multi-word Selection")."""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.utils import logging

logger = logging.get_logger(__name__)

# Written into every saved config.json: save_pretrained records only the class being saved, and one export must
# load through every Auto class. models/__init__.py registers the local classes from this same map.
AUTO_MAP = {
    "AutoConfig": "configuration_teams.TeamsConfig",
    "AutoModel": "modeling_teams.TeamsModel",
    "AutoModelForPreTraining": "modeling_teams.TeamsForPreTraining",
    "AutoModelForMaskedLM": "modeling_teams.TeamsForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_teams.TeamsForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_teams.TeamsForQuestionAnswering",
    "AutoModelForTokenClassification": "modeling_teams.TeamsForTokenClassification",
}

PRETRAINING_TASKS = ("rtd+mws", "rtd", "mws")
TASK_HEAD_TYPES = ("attention", "ffn")
TASK_HEAD_PLACEMENTS = ("penultimate", "last", "last_rtd_only")
# Saved configs from before `task_heads_on_layer` name the placement by `rtd_head_source`.
LEGACY_RTD_HEAD_SOURCES = {"penultimate": "penultimate", "last": "last_rtd_only"}
FINETUNE_REPRESENTATIONS = ("mws", "rtd")
LAYER_TYINGS = ("bottom_half", "none", "full")
NEGATIVE_SAMPLINGS = ("sampled", "hardest")


@strict
class TeamsConfig(PreTrainedConfig):
    r"""
    Configuration of a TEAMS generator + discriminator (and, with `pretraining_tasks="rtd"`, of ELECTRA).

    The discriminator is an ELECTRA encoder of `num_hidden_layers` (L) layers built from transformers' ELECTRA
    blocks. The generator has the same width and `generator_num_hidden_layers` layers; with
    `layer_tying="bottom_half"` its bottom half ARE the discriminator's bottom layers (Section 3.2). Both share the
    embeddings. The discriminator is trained with replaced token detection (RTD) and multi-word selection (MWS):
    a (K+1)-way choice of the original token among candidates the generator samples.

    Args:
        vocab_size: Word-piece vocabulary size.
        embedding_size: Width of the token embeddings, projected to `hidden_size` when smaller (128 -> 256 for small).
        hidden_size: Width of the discriminator.
        num_hidden_layers: Discriminator layers L. With attention task heads and the paper's placement, layer L is
            the MWS task layer and the RTD task layer is one extra layer fed from layer L-1.
        num_attention_heads: Attention heads per layer.
        intermediate_size: Width of each feed-forward block.
        hidden_act: Activation of the feed-forward blocks and the heads.
        hidden_dropout_prob: Dropout on embeddings and residual branches.
        attention_probs_dropout_prob: Dropout on attention probabilities.
        max_position_embeddings: Longest input.
        type_vocab_size: Segment types.
        initializer_range: Std of the N(0, std) init.
        layer_norm_eps: LayerNorm epsilon.
        pad_token_id: Padding id.
        classifier_dropout: Dropout of the fine-tuning heads (defaults to `hidden_dropout_prob`).
        generator_num_hidden_layers: Generator depth (default L/2, the paper's "1/2 of the discriminator").
        generator_hidden_size: Generator width (default `hidden_size`; ELECTRA's recipe uses a narrower one).
        generator_intermediate_size: Generator feed-forward width (default `intermediate_size`).
        generator_num_attention_heads: Generator heads (default `num_attention_heads`).
        layer_tying: "bottom_half" (TEAMS: the generator's bottom half of layers are the discriminator's bottom
            layers), "full" (every generator layer is a discriminator layer) or "none" (Table 4).
        pretraining_tasks: "rtd+mws" (TEAMS), "rtd" (ELECTRA) or "mws" (Table 2).
        task_head_type: "attention" (one transformer layer per task, Section 3.2) or "ffn" (both tasks read the top
            layer through feed-forward heads, Table 3). Only meaningful when two tasks are trained.
        task_heads_on_layer: Where the attention task heads branch off the discriminator (Table 3), when both tasks
            are trained with `task_head_type="attention"`:
            "penultimate" (the paper's design): layers 1..L-1 are task-agnostic; layer L is the MWS task layer and
            one extra layer, also fed from layer L-1, the RTD task layer (L+1 layers in all).
            "last" (Table 3, "Add task head on 12th layer"): layers 1..L are task-agnostic; one extra layer for RTD
            and one for MWS, both fed from layer L (L+2 layers; fine-tuning runs L+1).
            "last_rtd_only" (not in the paper; `rtd_head_source="last"` in older configs): one extra RTD layer fed
            from layer L, while MWS reads layer L through its dense head (L+1 layers).
        finetune_representation: What `TeamsModel` returns: "mws" (the MWS task layer's outputs, i.e. layer L or,
            with `task_heads_on_layer="last"`, the extra MWS layer; the paper found them fine-tune best) or "rtd"
            (the RTD task layer's outputs).
        num_negatives: K, the non-original candidates per masked position (the paper's K=5; the authors' code
            counts the original in its candidate set of 5, i.e. K=4).
        negative_sampling: "sampled" (K draws without replacement from the generator, the paper's choice) or
            "hardest" (the K most likely non-original tokens) (Figure 5).
        mlm_loss_weight: Weight of the generator's MLM loss.
        rtd_loss_weight: lambda_1, weight of the RTD loss (5 in TEAMS, 50 in ELECTRA).
        mws_loss_weight: lambda_2, weight of the MWS loss (2).
        unpad: Pretraining only (`pretrain.py --unpad`): the pretraining model runs the generator and the
            discriminator on the real tokens alone, a padded batch flattened into one row (a packed one as it is), with
            attention over each sequence by the `sdpa_varlen` attention (PyTorch's varlen flash kernel on a GPU in half
            precision, one SDPA call per sequence elsewhere). The same losses as the padded model; `rtd_logits`,
            `rtd_labels` and `corrupted_input_ids` come back padded. The fine-tuning heads ignore it.
        is_decoder: Always `False`; read by transformers' ELECTRA layers.
        add_cross_attention: Always `False`; read by transformers' ELECTRA layers.
    """

    model_type = "teams"

    # The encoder's fields under transformers' ElectraConfig names and types (tests/test_copies.py checks them)
    vocab_size: int = 30522
    embedding_size: int = 768
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    classifier_dropout: float | int | None = None
    generator_num_hidden_layers: int | None = None
    generator_hidden_size: int | None = None
    generator_intermediate_size: int | None = None
    generator_num_attention_heads: int | None = None
    layer_tying: str = "bottom_half"
    pretraining_tasks: str = "rtd+mws"
    task_head_type: str = "attention"
    task_heads_on_layer: str = "penultimate"
    finetune_representation: str = "mws"
    num_negatives: int = 5
    negative_sampling: str = "sampled"
    mlm_loss_weight: float = 1.0
    rtd_loss_weight: float = 5.0
    mws_loss_weight: float = 2.0
    unpad: bool = False
    is_decoder: bool = False
    add_cross_attention: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        self._read_legacy_rtd_head_source(kwargs)
        if self.generator_num_hidden_layers is None:
            self.generator_num_hidden_layers = max(1, self.num_hidden_layers // 2)
        self.generator_hidden_size = self.generator_hidden_size or self.hidden_size
        self.generator_intermediate_size = self.generator_intermediate_size or self.intermediate_size
        self.generator_num_attention_heads = self.generator_num_attention_heads or self.num_attention_heads
        super().__post_init__(**kwargs)
        self._check_choices()

    def _read_legacy_rtd_head_source(self, kwargs):
        """`rtd_head_source` (older configs) named only the RTD task layer's input; map it onto the placement."""
        if "rtd_head_source" not in kwargs:
            return
        legacy = kwargs.pop("rtd_head_source")
        if legacy not in LEGACY_RTD_HEAD_SOURCES:
            raise ValueError(f"TeamsConfig.rtd_head_source={legacy!r} is not a known value; use task_heads_on_layer.")
        if self.task_heads_on_layer != "penultimate":
            raise ValueError("Pass task_heads_on_layer alone; rtd_head_source is its old name.")
        logger.warning_once("TeamsConfig.rtd_head_source is deprecated; it is read as task_heads_on_layer.")
        # It was ignored where no RTD task layer exists; keep such configs loadable.
        if self.pretraining_tasks == "rtd+mws" and self.task_head_type == "attention":
            self.task_heads_on_layer = LEGACY_RTD_HEAD_SOURCES[legacy]

    def _check_choices(self):
        for name, choices in (
            ("pretraining_tasks", PRETRAINING_TASKS),
            ("task_head_type", TASK_HEAD_TYPES),
            ("task_heads_on_layer", TASK_HEAD_PLACEMENTS),
            ("finetune_representation", FINETUNE_REPRESENTATIONS),
            ("layer_tying", LAYER_TYINGS),
            ("negative_sampling", NEGATIVE_SAMPLINGS),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"TeamsConfig.{name}={getattr(self, name)!r}; choose one of {', '.join(choices)}.")
        if self.layer_tying != "none" and self.generator_hidden_size != self.hidden_size:
            raise ValueError(
                f"layer_tying={self.layer_tying!r} shares layers, so the generator needs the discriminator's width "
                f"({self.hidden_size}), not {self.generator_hidden_size}; use layer_tying='none' for a narrower "
                "generator."
            )
        if self.layer_tying == "full" and self.generator_num_hidden_layers > self.num_hidden_layers:
            raise ValueError("layer_tying='full' needs generator_num_hidden_layers <= num_hidden_layers.")
        if self.task_heads_on_layer != "penultimate" and not self.has_rtd_task_layer:
            raise ValueError(
                f"task_heads_on_layer={self.task_heads_on_layer!r} places attention task layers, which exist only "
                "with pretraining_tasks='rtd+mws' and task_head_type='attention'."
            )
        if self.finetune_representation == "rtd" and not self.has_rtd_task_layer:
            raise ValueError(
                "finetune_representation='rtd' reads the RTD attention task layer, which exists only with "
                "pretraining_tasks='rtd+mws' and task_head_type='attention'."
            )
        if self.num_negatives < 1 or self.num_negatives >= self.vocab_size:
            raise ValueError(f"num_negatives must be in [1, vocab_size), got {self.num_negatives}.")

    @property
    def trains_rtd(self) -> bool:
        return "rtd" in self.pretraining_tasks

    @property
    def trains_mws(self) -> bool:
        return "mws" in self.pretraining_tasks

    @property
    def sampler_draws(self) -> int:
        """Uniform draws per masked position a pretraining step reads from the collator (`sampler_uniforms`): one for
        the replacement, and K for sampled MWS candidates."""
        sampled = self.trains_mws and self.negative_sampling == "sampled"
        return 1 + (self.num_negatives if sampled else 0)

    @property
    def has_rtd_task_layer(self) -> bool:
        """An extra transformer layer for RTD exists only when two tasks share the discriminator."""
        return self.pretraining_tasks == "rtd+mws" and self.task_head_type == "attention"

    @property
    def has_mws_task_layer(self) -> bool:
        """An extra transformer layer for MWS exists only when both task heads sit on layer L."""
        return self.has_rtd_task_layer and self.task_heads_on_layer == "last"

    @property
    def task_source_layer(self) -> int:
        """How many discriminator layers run before the extra task layer(s): L-1 in the paper, L on layer L."""
        return self.num_hidden_layers - (1 if self.task_heads_on_layer == "penultimate" else 0)

    @property
    def num_shared_generator_layers(self) -> int:
        return {"bottom_half": self.generator_num_hidden_layers // 2, "full": self.generator_num_hidden_layers,
                "none": 0}[self.layer_tying]


__all__ = ["TeamsConfig", "AUTO_MAP"]
