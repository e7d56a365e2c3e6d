"""Two-tower cloze configuration (Baevski et al., 2019, "Cloze-driven Pretraining of Self-attention Networks")."""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

# Written into every saved config.json: save_pretrained records only the class being saved, and one export must
# load through every Auto class. models/__init__.py registers the local classes from this same map.
AUTO_MAP = {
    "AutoConfig": "configuration_cloze.TwoTowerClozeConfig",
    "AutoModel": "modeling_cloze.TwoTowerClozeModel",
    "AutoModelForPreTraining": "modeling_cloze.TwoTowerCloze",
    "AutoModelForMaskedLM": "modeling_cloze.TwoTowerClozeForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_cloze.TwoTowerClozeForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_cloze.TwoTowerClozeForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_cloze.TwoTowerClozeForQuestionAnswering",
}

QUERY_COMBINATIONS = ("sum", "concat")
LOSS_TYPES = ("cloze", "bilm", "cloze+bilm")
COMBINATION_MASKS = ("none", "curr", "cloze")
INPUT_REPRESENTATIONS = ("embedding", "char_cnn")
# Section 5.2: "six filters of size 1x128, 2x256, 3x384, 4x512, 5x512, 6x512" as (width, channels). (fairseq's own
# default for --character-filters, [(1, 64), (2, 128), (3, 192), (4, 256), (5, 256), (6, 256), (7, 256)], is not
# what the paper reports.)
PAPER_CHARACTER_FILTERS = [[1, 128], [2, 256], [3, 384], [4, 512], [5, 512], [6, 512]]
# Section 5.2: the adaptive softmax head holds the 60K most frequent types, then a 160K band.
PAPER_ADAPTIVE_SOFTMAX_CUTOFF = [60_000, 220_000]


@strict
class TwoTowerClozeConfig(PreTrainedConfig):
    r"""
    Configuration of the two-tower cloze model and its heads.

    A forward tower (left to right) and a backward tower (right to left) of `num_hidden_layers` pre-LN transformer
    blocks each read the same embeddings. A combination layer attends over the states of both towers with the query
    `F_{i-1} + B_{i+1}` and, during pretraining, sees only `F_{<i}` and `B_{>i}`, so it predicts every token from
    its whole context but never from the token itself (Section 3). Defaults are the paper's base model (Table 1:
    d = 1024, 6 blocks per tower, FFN 4096, 16 heads, summed query).

    Two details follow the authors' fairseq code (`bi_trans_lm`), where the paper is silent: the output `f` of the
    combination FFN goes to the softmax and to the fine-tuning heads without a LayerNorm after it (so the x16
    `classifier_scale` multiplies the same unnormalised `f` as in the paper), and the concatenated query
    `[F_{i-1}; B_{i+1}]` is projected once, by the combination attention's own 2d -> d query projection.

    Inputs are word-piece embeddings (the paper's BPE model) or, with `input_representation="char_cnn"`, a
    character CNN over each word (its CNN Base and Large models, Tables 1-6): the model still takes word ids, and
    a `(vocab_size, max_word_characters)` table saved in the checkpoint spells each word in UTF-8 bytes.

    Args:
        vocab_size: Vocabulary size (default: BERT's uncased word pieces, the zoo's tokenizer; the paper's BPE model
            had 55K types).
        hidden_size: Model width d (1024).
        num_hidden_layers: Blocks per tower (6 for the base model, 12 for the large ones).
        num_attention_heads: Attention heads of the tower blocks (16).
        combination_attention_heads: Heads of the combination attention (default `num_attention_heads`). Table 1
            lists 12 for the base model, which does not divide d = 1024, and 32 for the large ones.
        intermediate_size: Width of every ReLU feed-forward block (4096).
        hidden_dropout_prob: Dropout on embeddings, residual branches and the combination attention output (0.1).
        attention_probs_dropout_prob: Dropout on attention probabilities (0.1).
        activation_dropout: Dropout after the ReLU of every feed-forward block (0.05).
        max_position_embeddings: Longest input the sinusoidal position table covers.
        layer_norm_eps: LayerNorm epsilon (fairseq's 1e-5).
        initializer_range: Std of the N(0, std) init of every Linear and Embedding.
        pad_token_id: Padding id.
        bos_token_id: Start boundary token (`<s>`; `[CLS]` with BERT tokenizers).
        eos_token_id: End boundary token (`<s>` in the paper; `[SEP]` with BERT tokenizers).
        sep_token_id: Separator between the two sentences of a pair (`<sep>`; `[SEP]` with BERT tokenizers). The
            sequence classifier reads its first occurrence before the end boundary.
        query_combination: How `F_{i-1}` and `B_{i+1}` form the combination query: "sum" (base model) or "concat"
            (concatenate and project 2d -> d; large models).
        loss_type: Pretraining objective (Table 5): "cloze" (predict every token from the combination layer),
            "bilm" (each tower alone predicts the next token in its direction) or "cloze+bilm".
        bilm_loss_weight: Weight of the bilm term in "cloze+bilm" (0.15, Section 6.3).
        finetune_combination_mask: Combination mask of the bare model and the fine-tuning heads: "none" (every
            state of both towers is visible, the paper's choice), "curr" (`F_{<=i}` and `B_{>=i}`) or "cloze" (the
            pretraining mask `F_{<i}`, `B_{>i}`).
        classifier_scale: Factor on the language model outputs before the sequence classifier (16): a larger
            effective learning rate for the new projection.
        classifier_dropout: Dropout before the fine-tuning classifiers (defaults to `hidden_dropout_prob`).
        use_adaptive_softmax: Output through an adaptive softmax (the paper's word-based models) instead of the flat
            softmax tied to the input embeddings (its BPE model).
        adaptive_softmax_cutoff: Band boundaries of the adaptive softmax. Default: the paper's bands, a 60K head
            and a 160K band (Section 5.2, for 700K and 1M types), scaled down in proportion below 700K types.
        adaptive_softmax_div_value: Width divisor from one band to the next (4: 1024 -> 256 -> 64 in the paper).
        tie_word_embeddings: Tie the flat output projection to the input embeddings (never with `char_cnn` inputs,
            which have no embedding matrix to tie to).
        input_representation: "embedding" (a word-piece embedding matrix) or "char_cnn" (Section 3.1: a character
            CNN, Kim et al., 2016, over the bytes of each word of a word vocabulary; pair it with the adaptive
            softmax as the paper does).
        character_embedding_size: Width of the byte embeddings of the character CNN (128).
        character_filters: `[width, channels]` of each convolution (default: the paper's six, 1x128 to 6x512).
        highway_layers: Highway layers after the max-pooled convolutions (1).
        max_word_characters: Bytes of a word the CNN reads; longer words are cut (fairseq's 50).
    """

    model_type = "cloze"

    vocab_size: int = 30522
    hidden_size: int = 1024
    num_hidden_layers: int = 6
    num_attention_heads: int = 16
    combination_attention_heads: int | None = None
    intermediate_size: int = 4096
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    activation_dropout: float | int = 0.05
    max_position_embeddings: int = 512
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    bos_token_id: int | None = 101
    eos_token_id: int | None = 102
    sep_token_id: int | None = 102
    query_combination: str = "sum"
    loss_type: str = "cloze"
    bilm_loss_weight: float | int = 0.15
    finetune_combination_mask: str = "none"
    classifier_scale: float | int = 16.0
    classifier_dropout: float | int | None = None
    use_adaptive_softmax: bool = False
    adaptive_softmax_cutoff: list[int] | None = None
    adaptive_softmax_div_value: float | int = 4.0
    tie_word_embeddings: bool = True
    input_representation: str = "embedding"
    character_embedding_size: int = 128
    character_filters: list[list[int]] | None = None
    highway_layers: int = 1
    max_word_characters: int = 50

    def __post_init__(self, **kwargs):
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        self.combination_attention_heads = self.combination_attention_heads or self.num_attention_heads
        if self.use_adaptive_softmax and self.adaptive_softmax_cutoff is None:
            # The paper's bands (60K, 60K + 160K) from 700K types on; smaller vocabularies keep their proportions.
            self.adaptive_softmax_cutoff = [
                max(1, min(PAPER_ADAPTIVE_SOFTMAX_CUTOFF[0], self.vocab_size * 6 // 70)),
                max(2, min(PAPER_ADAPTIVE_SOFTMAX_CUTOFF[1], self.vocab_size * 22 // 70)),
            ]
        if self.input_representation == "char_cnn":
            self.tie_word_embeddings = False
            if self.character_filters is None:
                self.character_filters = [list(f) for f in PAPER_CHARACTER_FILTERS]
        super().__post_init__(**kwargs)
        self._check_choices()

    @property
    def hidden_states_size(self) -> int:
        """The width of `hidden_states`: both towers' states concatenated (2d). A model that reads the encoder's
        layers (HIRE) takes it as its input width."""
        return 2 * self.hidden_size

    def _check_choices(self):
        for name, choices in (
            ("query_combination", QUERY_COMBINATIONS),
            ("loss_type", LOSS_TYPES),
            ("finetune_combination_mask", COMBINATION_MASKS),
            ("input_representation", INPUT_REPRESENTATIONS),
        ):
            if getattr(self, name) not in choices:
                options = ", ".join(map(repr, choices))
                raise ValueError(f"TwoTowerClozeConfig.{name}={getattr(self, name)!r}; choose one of {options}.")
        for name in ("num_attention_heads", "combination_attention_heads"):
            if self.hidden_size % getattr(self, name):
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) must be a multiple of {name} ({getattr(self, name)})."
                )
        if self.use_adaptive_softmax:
            cutoff = list(self.adaptive_softmax_cutoff)
            if not cutoff or cutoff != sorted(set(cutoff)) or cutoff[0] < 1 or cutoff[-1] >= self.vocab_size:
                raise ValueError(
                    f"adaptive_softmax_cutoff must be strictly increasing values in [1, vocab_size={self.vocab_size}), "
                    f"got {cutoff}."
                )
        if self.input_representation == "char_cnn":
            filters = self.character_filters
            if not filters or any(len(f) != 2 or min(f) < 1 for f in filters):
                raise ValueError(f"character_filters must be [width, channels] pairs of positive ints, got {filters}.")
            if max(width for width, _ in filters) > self.max_word_characters:
                raise ValueError(
                    f"max_word_characters ({self.max_word_characters}) must be at least the widest character filter."
                )


__all__ = ["TwoTowerClozeConfig", "AUTO_MAP"]
