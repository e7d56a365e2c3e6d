"""SpanBERT configuration (Joshi et al., 2020, "SpanBERT: Improving Pre-training by Representing and Predicting
Spans")."""

from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

# Written into every saved config.json: save_pretrained records only the class being saved, and one export must
# load through every Auto class. models/__init__.py registers the local classes from this same map.
AUTO_MAP = {
    "AutoConfig": "configuration_spanbert.SpanBertConfig",
    "AutoModel": "modeling_spanbert.SpanBertModel",
    "AutoModelForPreTraining": "modeling_spanbert.SpanBertForPreTraining",
    "AutoModelForMaskedLM": "modeling_spanbert.SpanBertForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_spanbert.SpanBertForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_spanbert.SpanBertForQuestionAnswering",
    "AutoModelForTokenClassification": "modeling_spanbert.SpanBertForTokenClassification",
}


@strict
class SpanBertConfig(PreTrainedConfig):
    r"""
    Configuration of a SpanBERT encoder and its pretraining heads.

    The encoder is BERT's (transformers' `BertEmbeddings` + `BertEncoder`). Pretraining adds the masked-LM head and the
    span boundary objective (SBO) head of Section 3.2:
    `y_i = LayerNorm(GeLU(W2 LayerNorm(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s+1}]))))`.

    Args:
        vocab_size: Word-piece vocabulary size.
        hidden_size: Width of the encoder.
        num_hidden_layers: Number of transformer layers.
        num_attention_heads: Attention heads per layer.
        intermediate_size: Width of each feed-forward block.
        hidden_act: Activation of the feed-forward blocks and of both prediction heads (GeLU in the paper).
        hidden_dropout_prob: Dropout on embeddings and every residual branch.
        attention_probs_dropout_prob: Dropout on attention probabilities.
        max_position_embeddings: Longest input the absolute position table covers (512 in the paper).
        type_vocab_size: Segment types. SpanBERT trains on single segments, so 1 suffices; 2 keeps pair fine-tuning
            compatible with BERT-style tokenizers that emit `token_type_ids`, and the two-segment baselines need it.
        initializer_range: Std of the N(0, std) init of every Linear and Embedding.
        layer_norm_eps: LayerNorm epsilon.
        pad_token_id: Padding id.
        classifier_dropout: Dropout before the fine-tuning classifiers (defaults to `hidden_dropout_prob`).
        use_span_boundary_objective: Train the SBO head. `False` gives the plain BERT-MLM baseline on the same code
            path (Table 7's "no SBO" rows).
        sbo_position_embedding_size: Width of the relative position embeddings `p_1, p_2, ...` (200 in the paper).
        max_span_targets: Longest span the SBO predicts; relative positions beyond it are not trained (the authors'
            code uses 15 targets per span; geometric spans are clipped at 10 words).
        use_next_sentence_prediction: Train BERT's next sentence prediction (NSP) head: a pooler (dense + tanh over
            `[CLS]`) and a 2-way classifier, on `[CLS] A [SEP] B [SEP]` pairs. `True` gives the "2seq + NSP" rows of
            Tables 6 and 7; SpanBERT itself drops NSP (Section 3.3). The pooler stays in the bare model, so
            `AutoModel` returns its `pooler_output` and sequence classification reads it.
        mlm_loss_weight: Weight of the MLM loss in the pretraining loss.
        sbo_loss_weight: Weight of the SBO loss (the paper sums both, weight 1).
        sbo_loss_normalization: What the summed SBO cross-entropy of a batch is divided by. `"authors"` (default):
            the number of SBO targets + 1, as the authors' `span_bert_loss` criterion does (the paper does not say); a
            batch of n targets then weighs the SBO term n/(n+1) of its mean (44/45 for 44 targets, 0.9996 for the
            ~2,460 targets of 32 blocks of 512 tokens). `"mean"`: the number of targets, the plain mean cross-entropy.
        nsp_loss_weight: Weight of the NSP loss (BERT sums it with the MLM loss, weight 1).
        unpad: Pretraining only (`pretrain.py --unpad`): the pretraining model runs its encoder on the real tokens
            alone, a padded batch flattened into one row (a packed one as it is), with attention over each sequence
            by the `sdpa_varlen` attention (PyTorch's varlen flash kernel on a GPU in half precision, one SDPA call
            per sequence elsewhere). The same loss as the padded model; the fine-tuning heads ignore it.
        is_decoder: Always `False`; read by transformers' BERT layers.
        add_cross_attention: Always `False`; read by transformers' BERT layers.
    """

    model_type = "spanbert"

    # The encoder's fields under transformers' BertConfig names and types (tests/test_copies.py checks them)
    vocab_size: int = 28996
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    classifier_dropout: float | int | None = None
    use_span_boundary_objective: bool = True
    sbo_position_embedding_size: int = 200
    max_span_targets: int = 15
    use_next_sentence_prediction: bool = False
    mlm_loss_weight: float = 1.0
    sbo_loss_weight: float = 1.0
    sbo_loss_normalization: Literal["authors", "mean"] = "authors"
    nsp_loss_weight: float = 1.0
    unpad: bool = False
    is_decoder: bool = False
    add_cross_attention: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__post_init__(**kwargs)


__all__ = ["SpanBertConfig", "AUTO_MAP"]
