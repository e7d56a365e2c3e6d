"""SpanBERT: a BERT encoder pretrained with span masking and the span boundary objective (SBO).

The encoder reuses transformers' BERT blocks (and with them SDPA / eager / flash attention). The pretraining head
computes vocabulary logits only at the positions that carry a target. The two-segment baselines of the paper's
ablations add BERT's next sentence prediction head (`config.use_next_sentence_prediction`).
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn import functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import (
    create_bidirectional_mask,
    find_packed_sequence_indices,
    packed_sequence_mask_function,
)
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.models.bert.modeling_bert import (
    BertEmbeddings,
    BertEncoder,
    BertLayer,
    BertLMPredictionHead,
    BertPooler,
    BertPreTrainingHeads,
    BertSelfAttention,
)
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .configuration_spanbert import SpanBertConfig


@dataclass
class SpanBertForPreTrainingOutput(ModelOutput):
    """
    loss: weighted sum of the MLM loss (mean over masked tokens), the SBO loss (summed over the SBO targets, divided
        by their number + 1 as the authors' code does, or by their number: `config.sbo_loss_normalization`) and, with
        NSP, the NSP loss (mean over the batch); each term only when its targets are given, None without any.
    mlm_loss / sbo_loss / nsp_loss: the terms before weighting.
    nsp_accuracy: detached NSP accuracy, for logging.
    mlm_logits: with `labels`, `(num_masked_tokens, vocab_size)`, one row per `labels != -100` position, row-major
        order; without, `(batch, seq_len, vocab_size)` at every position (BertForPreTraining's `prediction_logits`),
        or one row per `prediction_mask` position. With `target_positions`, one row per buffer slot, `(B * K, V)`.
    sbo_logits: `(num_sbo_targets, vocab_size)`, one row per `span_left >= 0` position (the first
        `max_span_targets` of each span), row-major order; only when `span_left` / `span_right` are given. With
        `target_positions`, one row per buffer slot (the slots without an SBO target are not trained).
    nsp_logits: `(batch, 2)`, with the NSP head: column 0 "B continues A", column 1 "B is random".
    """

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    sbo_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    nsp_accuracy: torch.Tensor | None = None
    mlm_logits: torch.Tensor | None = None
    sbo_logits: torch.Tensor | None = None
    nsp_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def bidirectional_attention_mask(config, embeddings: torch.Tensor, attention_mask, position_ids) -> tuple[object, bool]:
    """The attention mask for the configured attention implementation, and whether the batch is packed.

    A packed batch holds several sequences back to back in a row, without padding: no `attention_mask`, and
    `position_ids` that restart at 0 where a sequence starts (transformers' `DataCollatorWithFlattening` format).
    Each token then attends within its own sequence only: a block-diagonal mask for eager/SDPA/flex attention;
    flash attention reads the sequence boundaries from `cu_seq_lens_*` or `position_ids` in the layer kwargs.
    """
    sequence_index = (
        find_packed_sequence_indices(position_ids) if attention_mask is None and position_ids is not None else None
    )
    mask = create_bidirectional_mask(
        config=config,
        inputs_embeds=embeddings,
        attention_mask=attention_mask,
        and_mask_function=packed_sequence_mask_function(sequence_index) if sequence_index is not None else None,
    )
    return mask, sequence_index is not None


# The attention of `config.unpad`: sequences flattened into one row, told apart by their `cu_seq_lens_*`.
UNPADDED_ATTENTION = "sdpa_varlen"
# Attention implementations that read `cu_seq_lens_*` and attend within each sequence without a mask.
VARLEN_ATTENTION_IMPLEMENTATIONS = (UNPADDED_ATTENTION, "flash_attention_2", "flash_attention_3")


def varlen_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None, max_length_k=None, **kwargs):
    """Attention over sequences flattened into one row `(1, heads, tokens, head_dim)`, bounded by `cu_seq_lens_*`.

    On a GPU in half precision: PyTorch's own varlen flash kernel (`aten::_flash_attention_forward`, which takes the
    attention dropout, unlike `torch.nn.attention.varlen.varlen_attn`; no flash-attn package). Elsewhere: one SDPA call
    per sequence, the reference the CPU tests run. Without `cu_seq_lens_q` (a padded batch): transformers' SDPA.
    """
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    if getattr(module, "is_causal", False):
        raise ValueError(f"{UNPADDED_ATTENTION} attention is bidirectional; {type(module).__name__} is causal.")
    query, key, value = (t[0].transpose(0, 1) for t in (query, key, value))  # (tokens, heads, head_dim)
    head_dim = query.shape[-1]
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and head_dim % 8 == 0 and head_dim <= 256:
        output = flash_varlen_attention(query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k,
                                        dropout, scaling)
    else:
        bounds = cu_seq_lens_q.tolist()  # the reference path: a host sync is fine here
        output = torch.cat([
            F.scaled_dot_product_attention(*(t[start:end].transpose(0, 1) for t in (query, key, value)),
                                           dropout_p=dropout, scale=scaling).transpose(0, 1)
            for start, end in zip(bounds[:-1], bounds[1:])
        ])
    return output[None], None


AttentionInterface.register(UNPADDED_ATTENTION, varlen_attention_forward)


def flash_varlen_attention(query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, dropout,
                           scaling) -> torch.Tensor:
    """PyTorch's varlen flash kernel, `(tokens, heads, head_dim)` in and out, non-causal, with attention dropout (its
    backward replays the forward's dropout mask from the returned RNG state; autograd knows the op)."""
    return torch.ops.aten._flash_attention_forward(
        query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, dropout, False, False,
        scale=scaling,
    )[0]


def runs_unpadded(config, attention_mask, kwargs: dict) -> bool:
    """Whether the layers attend over unpadded sequences (`config.unpad` and a packed row with its `cu_seq_lens_*`):
    no mask is built then, and the attention must read the sequence boundaries."""
    if not (getattr(config, "unpad", False) and attention_mask is None and kwargs.get("cu_seq_lens_q") is not None):
        return False
    if config._attn_implementation not in VARLEN_ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"config.unpad (--unpad) runs attention on unpadded sequences, which "
                         f"{config._attn_implementation!r} attention cannot tell apart: use attn_implementation="
                         f"{UNPADDED_ATTENTION!r} (PyTorch's varlen flash kernel) or flash_attention_2/3.")
    return True


def unpad_batch(attention_mask: torch.Tensor, per_token: dict, boundaries: dict, targets: dict) -> tuple[dict, object]:
    """A right-padded batch flattened into one row of its real tokens, as `training.data.packing.pack_batch` packs it
    on the host: per-token tensors keep their real tokens; `boundaries` (per-token positions, -1 for none) and
    `targets` (per-row position lists, -1 for an empty slot) are shifted by their row's start. Returns the packed
    inputs, with `position_ids` and `cu_seq_lens_*` / `max_length_*`, and the real tokens' flat indices."""
    real = attention_mask.bool()
    batch, width = real.shape
    lengths = real.sum(1)
    starts = (lengths.cumsum(0) - lengths)[:, None]
    flat = real.flatten().nonzero().squeeze(1)  # the number of real tokens: a host sync (--unpad packs on the host)
    packed = {"position_ids": torch.arange(width, device=real.device).expand(batch, width).flatten()[flat][None]}
    for name, values in {**per_token, **boundaries, **targets}.items():
        if values is None:
            continue
        if name in boundaries or name in targets:
            values = torch.where(values >= 0, values + starts, values)
        packed[name] = values.flatten()[None] if name in targets else values.flatten(0, 1)[flat][None]
    bounds = F.pad(lengths.cumsum(0).to(torch.int32), (1, 0))
    longest = int(lengths.max())
    packed.update(cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=longest, max_length_k=longest)
    return packed, flat


def pad_back(values: torch.Tensor, flat: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
    """`values` `(1, tokens)` of an unpadded batch put back into the padded shape, over a copy of `padded`."""
    out = padded.clone().flatten()
    out[flat] = values[0].to(out.dtype)
    return out.view(padded.shape)


def buffer_slots(target_positions: torch.Tensor):
    """Rows, columns and validity of a fixed-size target buffer `(B, K)` (positions, -1 for an empty slot), flat.
    Empty slots point at column 0 ([CLS], never a target), so every gather stays in bounds without a host sync."""
    rows = torch.arange(target_positions.shape[0], device=target_positions.device)[:, None]
    return (rows.expand_as(target_positions).flatten(), target_positions.clamp(min=0).flatten(),
            (target_positions >= 0).flatten())


def layer_at_positions(layer: nn.Module, hidden: torch.Tensor, mask, rows, cols, **kwargs) -> torch.Tensor:
    """`layer(hidden, mask, **kwargs)[rows, cols]` for a BERT/ELECTRA layer whose output is read only there.

    The feed-forward block is position-wise, so it runs at those positions only; attention still reads every
    position. Same values, a fraction of the layer's FLOPs (dropout draws masks for the computed rows only).
    """
    # Keep the layer's own call under activation checkpointing, and for an FSDP2 unit, whose parameters are
    # gathered by hooks on the layer's forward only.
    if (layer.gradient_checkpointing and layer.training) or isinstance(layer, FSDPModule):
        return layer(hidden, mask, **kwargs)[rows, cols]
    attention_output = layer.attention(hidden, mask, **kwargs)[0]
    return layer.feed_forward_chunk(attention_output[rows, cols])


class SpanBertPreTrainedModel(PreTrainedModel):
    config_class = SpanBertConfig
    config: SpanBertConfig
    base_model_prefix = "spanbert"
    supports_gradient_checkpointing = True
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["BertEmbeddings", "BertLayer"]
    _can_record_outputs = {"hidden_states": BertLayer, "attentions": BertSelfAttention}

    @torch.no_grad()
    def _init_weights(self, module):
        # N(0, initializer_range) for Linear/Embedding, LayerNorm (1, 0), biases 0: the authors' init.
        super()._init_weights(module)
        if isinstance(module, (BertLMPredictionHead, SpanBoundaryHead)):
            init.zeros_(module.bias)
        elif isinstance(module, BertEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)


class SpanBertModel(SpanBertPreTrainedModel):
    """The bare SpanBERT encoder: BERT embeddings and layers. Only a model pretrained with next sentence prediction
    has a pooler (BERT's dense + tanh over `[CLS]`, which NSP trains); SpanBERT never trains one.

    `add_pooling_layer=False` leaves that pooler out for heads that never read it (its weights are then dropped).
    """

    # A pretraining export also holds the MLM, SBO and NSP heads (and NSP's pooler), which the encoder does not read:
    # loading it here is no mismatch. transformers adds these patterns to every model that holds this one (the task
    # heads); any other key that does not fit is still reported.
    _keys_to_ignore_on_load_unexpected = [r"^cls\.predictions\.", r"^cls\.seq_relationship\.", r"^sbo\.",
                                          r"^(spanbert\.)?pooler\."]

    def __init__(self, config: SpanBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer and config.use_next_sentence_prediction else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def embed(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, **kwargs):
        """Embeddings, the attention mask, and the kwargs for the layers (with `position_ids` for a packed batch)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        sequence_length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        # A packed row may be longer than the position table: its position_ids restart with every sequence.
        if position_ids is None and sequence_length > self.config.max_position_embeddings:
            raise ValueError(
                f"Input has {sequence_length} tokens but this model has {self.config.max_position_embeddings} "
                "positions; truncate the input (e.g. tokenizer(..., truncation=True, max_length=...))."
            )
        embedding_output = self.embeddings(
            input_ids=input_ids, position_ids=position_ids, token_type_ids=token_type_ids, inputs_embeds=inputs_embeds
        )
        if runs_unpadded(self.config, attention_mask, kwargs):  # no (tokens x tokens) mask: attention reads cu_seq_lens
            mask, packed = None, True
        else:
            mask, packed = bidirectional_attention_mask(self.config, embedding_output, attention_mask, position_ids)
        if packed:
            if self.pooler is not None:
                raise ValueError(
                    "The pooler (next sentence prediction) reads each row's first token and cannot read packed "
                    "sequences; pad the batch instead (drop --packing)."
                )
            kwargs = {"position_ids": position_ids, **kwargs}  # flash attention finds the sequences from them
        return embedding_output, mask, kwargs

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPooling:
        r"""
        position_ids: with `attention_mask=None`, positions that restart at 0 mark sequences packed into one row
            (see `bidirectional_attention_mask`); pass `cu_seq_lens_q/k` and `max_length_q/k` too for flash attention.
        """
        embedding_output, attention_mask, layer_kwargs = self.embed(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, **kwargs
        )
        sequence_output = self.encoder(embedding_output, attention_mask=attention_mask,
                                       **layer_kwargs).last_hidden_state
        return BaseModelOutputWithPooling(
            last_hidden_state=sequence_output,
            pooler_output=self.pooler(sequence_output) if self.pooler is not None else None,
        )


class SpanBoundaryHead(nn.Module):
    """SBO: `y_i = LN(GeLU(W2 LN(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s+1}]))))`, decoded with the tied word embeddings.

    A prediction depends only on the two outside boundary states and the relative position of the target.
    """

    def __init__(self, config: SpanBertConfig):
        super().__init__()
        hidden = config.hidden_size
        self.position_embeddings = nn.Embedding(config.max_span_targets, config.sbo_position_embedding_size)
        self.mlp = nn.Sequential(
            nn.Linear(2 * hidden + config.sbo_position_embedding_size, hidden),
            ACT2FN[config.hidden_act],
            nn.LayerNorm(hidden, eps=config.layer_norm_eps),
            nn.Linear(hidden, hidden),
            ACT2FN[config.hidden_act],
            nn.LayerNorm(hidden, eps=config.layer_norm_eps),
        )
        # decoder.bias is tied to `bias` (BertLMPredictionHead's convention), so resize_token_embeddings pads it.
        self.decoder = nn.Linear(hidden, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, left: torch.Tensor, right: torch.Tensor, relative_position: torch.Tensor) -> torch.Tensor:
        """left/right: `(N, H)` boundary states; relative_position: `(N,)`, 0 for the first span token."""
        h0 = torch.cat([left, right, self.position_embeddings(relative_position)], dim=-1)
        # The bias inside the matmul (addmm): no second pass over the (N, vocabulary) logits.
        return F.linear(self.mlp(h0), self.decoder.weight, self.bias)


def use_varlen_attention(model: nn.Module) -> None:
    """`config.unpad` runs attention on unpadded sequences: the default SDPA becomes its varlen form (which is SDPA
    itself on padded batches: evaluation and fine-tuning are unchanged), in every config the model's modules read (a
    narrower generator has its own). Any other choice is kept, and checked when a batch runs unpadded
    (`runs_unpadded`)."""
    if not getattr(model.config, "unpad", False):
        return
    for config in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
        if getattr(config, "_attn_implementation", None) == "sdpa":
            config._attn_implementation = UNPADDED_ATTENTION


class SpanBertForPreTraining(SpanBertPreTrainedModel):
    """MLM + span boundary objective. With `config.use_span_boundary_objective=False` it is the BERT-MLM baseline;
    with `config.use_next_sentence_prediction=True` it adds BERT's NSP head (the two-segment baselines), under
    BertForPreTraining's weight names (`spanbert.pooler`, `cls.seq_relationship`)."""

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "spanbert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }
    # Reads sequences packed into one row (position_ids restarting at 0, no attention_mask): training.packing.
    _supports_packed_sequences = True
    # The pretraining loss is a fixed mean per objective; Trainer must not rescale it by its token count.
    accepts_loss_kwargs = False

    def __init__(self, config: SpanBertConfig):
        super().__init__(config)
        self.spanbert = SpanBertModel(config)
        if config.use_next_sentence_prediction:
            self.cls = BertPreTrainingHeads(config)  # predictions + seq_relationship, Linear(H, 2) on the pooler
        else:
            self.cls = nn.Module()
            self.cls.predictions = BertLMPredictionHead(config)
        self.sbo = SpanBoundaryHead(config) if config.use_span_boundary_objective else None
        if self.sbo is not None:  # the BERT baseline has no SBO decoder to tie
            self._tied_weights_keys = {
                **self._tied_weights_keys,
                "sbo.decoder.weight": "spanbert.embeddings.word_embeddings.weight",
                "sbo.decoder.bias": "sbo.bias",
            }
        self.post_init()
        use_varlen_attention(self)

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        span_left: torch.Tensor | None = None,
        span_right: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        prediction_mask: torch.Tensor | None = None,
        target_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> SpanBertForPreTrainingOutput:
        r"""
        labels: `(B, T)` original token ids at masked positions, -100 elsewhere. MLM logits are then computed at these
            positions only.
        span_left / span_right: `(B, T)` positions of the outside boundary tokens `s-1` and `e+1` of the merged span
            that covers each SBO target, -1 at positions without an SBO target (built by `SpanMaskingCollator`). The
            SBO head predicts (and, with `labels`, trains) only where they are given.
        next_sentence_label: `(B,)` 0 where segment B continues segment A, 1 where B is random (BertForPreTraining's
            convention); with `config.use_next_sentence_prediction`, adds the NSP loss.
        prediction_mask: inference only, `(B, T)` bool: MLM logits only at these positions, `(N, vocab_size)` rows in
            row-major order. Without it and without labels, MLM logits at every position, `(B, T, vocab_size)`.
        target_positions: with `labels`, the fixed-size target buffer (`SpanMaskingCollator(target_buffer=True)`):
            `(B, K)` each row's masked positions, ascending, then -1. The step then has no data-dependent shape (no
            host sync): `mlm_logits` and `sbo_logits` have one row per slot, `(B * K, vocab_size)`, and empty slots
            (and, for SBO, slots without an SBO target) are left out of the losses. The same losses as without it.

        With `config.unpad` a padded training batch is flattened into one row of its real tokens first (`unpad_batch`).
        Each loss term is computed when its targets are given (MLM: `labels`; SBO: `labels` and the span boundaries;
        NSP: `next_sentence_label`); `loss` is their weighted sum, None without any.
        """
        self.check_inputs(labels, span_left, span_right, next_sentence_label, prediction_mask, target_positions)
        records_outputs = any(
            kwargs.get(name, getattr(self.config, name)) for name in ("output_hidden_states", "output_attentions")
        )
        if self.config.unpad and labels is not None and attention_mask is not None and not records_outputs:
            return self.unpadded_forward(input_ids, attention_mask, labels, span_left, span_right, target_positions,
                                         token_type_ids=token_type_ids, position_ids=position_ids,
                                         inputs_embeds=inputs_embeds, **kwargs)
        if target_positions is not None:
            return self.buffered_forward(input_ids, labels, target_positions, span_left, span_right,
                                         next_sentence_label, token_type_ids=token_type_ids,
                                         position_ids=position_ids, attention_mask=attention_mask,
                                         inputs_embeds=inputs_embeds, **kwargs)
        encoder_inputs = dict(attention_mask=attention_mask, token_type_ids=token_type_ids, position_ids=position_ids,
                              inputs_embeds=inputs_embeds)
        return self.padded_forward(input_ids, labels, span_left, span_right, next_sentence_label, prediction_mask,
                                   records_outputs, encoder_inputs, **kwargs)

    def check_inputs(self, labels, span_left, span_right, next_sentence_label, prediction_mask, target_positions):
        """`forward`'s refusals of inputs that do not go together, one line each."""
        if next_sentence_label is not None and not self.config.use_next_sentence_prediction:
            raise ValueError(
                "Got next_sentence_label but this model has no NSP head; set config.use_next_sentence_prediction=True "
                "or drop the labels."
            )
        if (span_left is None) != (span_right is None):
            raise ValueError("The span boundary objective reads span_left and span_right together; pass both or "
                             "neither.")
        if labels is not None and prediction_mask is not None:
            raise ValueError("prediction_mask chooses where to predict without labels; with labels, MLM logits are "
                             "computed at the labelled positions.")
        if target_positions is not None and labels is None:
            raise ValueError("target_positions lists where the labels are (the fixed-size target buffer); pass labels "
                             "too.")

    def unpadded_forward(self, input_ids, attention_mask, labels, span_left, span_right, target_positions,
                         token_type_ids=None, position_ids=None, inputs_embeds=None,
                         **kwargs) -> SpanBertForPreTrainingOutput:
        """`forward` with `config.unpad`: the padded training batch flattened into one row of its real tokens
        (`unpad_batch`), then run as that packed row."""
        if self.config.use_next_sentence_prediction:
            raise ValueError("config.unpad (--unpad): next sentence prediction reads each row's first token, "
                             "which an unpadded batch does not keep per row; train this recipe without --unpad.")
        packed, _ = unpad_batch(
            attention_mask,
            per_token=dict(input_ids=input_ids, labels=labels, token_type_ids=token_type_ids,
                           position_ids=position_ids, inputs_embeds=inputs_embeds),
            boundaries=dict(span_left=span_left, span_right=span_right),
            targets=dict(target_positions=target_positions),
        )
        return self(**packed, **kwargs)

    def padded_forward(self, input_ids, labels, span_left, span_right, next_sentence_label, prediction_mask,
                       records_outputs: bool, encoder_inputs: dict, **kwargs) -> SpanBertForPreTrainingOutput:
        """`forward` on a padded batch, or on a row packed on the host: logits at the gathered targets' positions."""
        has_nsp_head = self.config.use_next_sentence_prediction
        # Collected here, built at the end: a ModelOutput orders its tuple by when each field was set.
        output = {}
        # The data-dependent index sets first: under torch.compile they split the graph before the encoder, not in it.
        targets = labels != -100 if labels is not None else prediction_mask
        mlm_rows, mlm_cols = targets.nonzero(as_tuple=True) if targets is not None else (None, None)
        sbo_targets = (self.sbo_targets(span_left, span_right) if self.sbo is not None and span_left is not None
                       else None)
        if labels is None or records_outputs:
            outputs = self.spanbert(input_ids, **encoder_inputs, return_dict=True, **kwargs)
            output.update(hidden_states=outputs.hidden_states, attentions=outputs.attentions)
            sequence_output = outputs.last_hidden_state
            states_at = lambda rows, cols: sequence_output[rows, cols]  # noqa: E731
            pooled = outputs.pooler_output
        else:
            read = self.read_positions(labels, (mlm_rows, mlm_cols), sbo_targets)
            states_at, pooled = self.encode_at(read, input_ids, encoder_inputs, labels.shape, **kwargs)

        # Vocabulary logits only where there is something to predict: the targets' rows are gathered first.
        if targets is None:
            output["mlm_logits"] = self.cls.predictions(sequence_output)
        else:
            output["mlm_logits"] = self.cls.predictions(states_at(mlm_rows, mlm_cols))
        if sbo_targets is not None:
            rows, cols, left, right = sbo_targets
            output["sbo_logits"] = self.sbo(states_at(rows, left), states_at(rows, right), cols - left - 1)
        if has_nsp_head:
            output["nsp_logits"] = self.cls.seq_relationship(pooled)

        losses = []
        if labels is not None:
            output["mlm_loss"] = F.cross_entropy(output["mlm_logits"].float(), labels[mlm_rows, mlm_cols])
            losses.append(self.config.mlm_loss_weight * output["mlm_loss"])
            if sbo_targets is not None:
                rows, cols = sbo_targets[:2]
                # The summed loss over the targets + 1 (the authors' criterion) or over the targets ("mean"). A batch
                # whose spans all touch the block edges has no SBO target; its SBO term is 0, not NaN.
                summed = F.cross_entropy(output["sbo_logits"].float(), labels[rows, cols], reduction="sum")
                extra = 1 if self.config.sbo_loss_normalization == "authors" else 0
                output["sbo_loss"] = summed / max(rows.numel() + extra, 1)
                losses.append(self.config.sbo_loss_weight * output["sbo_loss"])
        if next_sentence_label is not None:
            nsp_logits = output["nsp_logits"].float()
            output["nsp_loss"] = F.cross_entropy(nsp_logits, next_sentence_label.view(-1))
            output["nsp_accuracy"] = (nsp_logits.detach().argmax(-1) == next_sentence_label.view(-1)).float().mean()
            losses.append(self.config.nsp_loss_weight * output["nsp_loss"])
        if losses:
            output["loss"] = sum(losses[1:], losses[0])
        return SpanBertForPreTrainingOutput(**output)

    def buffered_forward(self, input_ids, labels, target_positions, span_left, span_right, next_sentence_label,
                         **encoder_inputs) -> SpanBertForPreTrainingOutput:
        """`forward` on the fixed-size target buffer: every shape follows the batch's, none its masks."""
        rows, cols, valid = buffer_slots(target_positions)
        mlm_labels = torch.where(valid, labels[rows, cols], -100)
        reads = [(rows, cols)]
        if self.sbo is not None and span_left is not None:
            left, right = span_left[rows, cols], span_right[rows, cols]
            relative = cols - left - 1
            is_sbo = valid & (left >= 0) & (relative < self.config.max_span_targets)
            sbo_labels = torch.where(is_sbo, mlm_labels, -100)
            reads += [(rows, left.clamp(min=0)), (rows, right.clamp(min=0))]
        if self.spanbert.pooler is not None:
            every_row = torch.arange(labels.shape[0], device=labels.device)
            reads.append((every_row, torch.zeros_like(every_row)))
        states, recorded = self.encode_reads(reads, input_ids, labels.shape, **encoder_inputs)
        output = dict(recorded)
        output["mlm_logits"] = self.cls.predictions(states[0])
        output["mlm_loss"] = F.cross_entropy(output["mlm_logits"].float(), mlm_labels)
        losses = [self.config.mlm_loss_weight * output["mlm_loss"]]
        if len(reads) > 1 + (self.spanbert.pooler is not None):
            relative = relative.clamp(0, self.config.max_span_targets - 1)
            output["sbo_logits"] = self.sbo(states[1], states[2], relative)
            summed = F.cross_entropy(output["sbo_logits"].float(), sbo_labels, reduction="sum")
            extra = 1 if self.config.sbo_loss_normalization == "authors" else 0
            output["sbo_loss"] = summed / ((sbo_labels != -100).sum() + extra).clamp(min=1)
            losses.append(self.config.sbo_loss_weight * output["sbo_loss"])
        if self.spanbert.pooler is not None:
            output["nsp_logits"] = self.cls.seq_relationship(self.spanbert.pooler(states[-1][:, None]))
            if next_sentence_label is not None:
                nsp_logits = output["nsp_logits"].float()
                output["nsp_loss"] = F.cross_entropy(nsp_logits, next_sentence_label.view(-1))
                output["nsp_accuracy"] = (nsp_logits.detach().argmax(-1) == next_sentence_label.view(-1)).float().mean()
                losses.append(self.config.nsp_loss_weight * output["nsp_loss"])
        return SpanBertForPreTrainingOutput(loss=sum(losses[1:], losses[0]), **output)

    def encode_reads(self, reads, input_ids, shape, **encoder_inputs):
        """The encoder's last states at each `(rows, cols)` of `reads`, with no data-dependent shape: the last layer's
        feed-forward block runs at a fixed number of positions per row (three per buffer slot, at most the row),
        the read ones first, each once. Also returns the recorded hidden states/attentions when asked for."""
        kwargs = {k: v for k, v in encoder_inputs.items() if k not in ("token_type_ids", "position_ids",
                                                                        "attention_mask", "inputs_embeds")}
        if any(kwargs.get(name, getattr(self.config, name)) for name in ("output_hidden_states", "output_attentions")):
            outputs = self.spanbert(input_ids, **encoder_inputs, return_dict=True)
            states = outputs.last_hidden_state
            return ([states[r, c] for r, c in reads],
                    dict(hidden_states=outputs.hidden_states, attentions=outputs.attentions))
        encoder_inputs = {k: encoder_inputs.get(k) for k in ("attention_mask", "token_type_ids", "position_ids",
                                                            "inputs_embeds")}
        hidden, mask, layer_kwargs = self.spanbert.embed(input_ids, **encoder_inputs, **kwargs)
        *lower, last = self.spanbert.encoder.layer
        for layer in lower:
            hidden = layer(hidden, mask, **layer_kwargs)
        batch, width = shape
        read = torch.zeros(shape, dtype=torch.bool, device=hidden.device)
        for rows, cols in reads:
            read[rows, cols] = True
        computed = min(width, sum(rows.numel() for rows, _ in reads) // batch)
        order = torch.argsort((~read).to(torch.uint8), dim=1, stable=True)[:, :computed]  # read positions first
        every_row = torch.arange(batch, device=hidden.device)[:, None].expand_as(order)
        compact = layer_at_positions(last, hidden, mask, every_row.flatten(), order.flatten(), **layer_kwargs)
        compact_index = torch.zeros(shape, dtype=torch.long, device=hidden.device)
        compact_index.scatter_(1, order, torch.arange(order.numel(), device=hidden.device).view_as(order))
        return [compact[compact_index[rows, cols]] for rows, cols in reads], {}

    def sbo_targets(self, span_left: torch.Tensor, span_right: torch.Tensor):
        """Rows, columns and the two outside boundary columns of every SBO target, row-major."""
        # Targets past the first max_span_targets of a span are dropped, as in the authors' code.
        relative = torch.arange(span_left.shape[1], device=span_left.device) - span_left - 1
        rows, cols = ((span_left >= 0) & (relative < self.config.max_span_targets)).nonzero(as_tuple=True)
        return rows, cols, span_left[rows, cols], span_right[rows, cols]

    def read_positions(self, labels: torch.Tensor, mlm_targets, sbo_targets) -> tuple[torch.Tensor, torch.Tensor]:
        """Where a head reads the encoder's output: masked tokens, SBO boundaries and, for NSP, `[CLS]`."""
        read = torch.zeros_like(labels, dtype=torch.bool)
        read[mlm_targets] = True
        if sbo_targets is not None:
            rows, _, left, right = sbo_targets
            read[rows, left] = True
            read[rows, right] = True
        if self.spanbert.pooler is not None:
            read[:, 0] = True
        return read.nonzero(as_tuple=True)

    def encode_at(self, read, input_ids, encoder_inputs: dict, shape, **kwargs):
        """The encoder run for the heads alone: the last layer's feed-forward block only at the `read` positions (see
        `layer_at_positions`). Returns `states_at(rows, cols)` and the pooled output (None without NSP)."""
        hidden, mask, layer_kwargs = self.spanbert.embed(input_ids, **encoder_inputs, **kwargs)
        *lower, last = self.spanbert.encoder.layer
        for layer in lower:
            hidden = layer(hidden, mask, **layer_kwargs)
        rows, cols = read
        compact = layer_at_positions(last, hidden, mask, rows, cols, **layer_kwargs)
        compact_index = torch.full(shape, -1, dtype=torch.long, device=rows.device)
        compact_index[rows, cols] = torch.arange(rows.numel(), device=rows.device)

        def states_at(rows, cols):
            return compact[compact_index[rows, cols]]

        pooled = None
        if self.spanbert.pooler is not None:
            every_row = torch.arange(shape[0], device=rows.device)
            pooled = self.spanbert.pooler(states_at(every_row, torch.zeros_like(every_row))[:, None])
        return states_at, pooled


class SpanBertForMaskedLM(SpanBertPreTrainedModel):
    """Masked-LM head over every position (what the fill-mask pipeline needs); pretraining uses the sparse head."""

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "spanbert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: SpanBertConfig):
        super().__init__(config)
        self.spanbert = SpanBertModel(config, add_pooling_layer=False)
        self.cls = nn.Module()
        self.cls.predictions = BertLMPredictionHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> MaskedLMOutput:
        outputs = self.spanbert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        logits = self.cls.predictions(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                              attentions=outputs.attentions)


# The fine-tuning heads are transformers' BERT heads over SpanBertModel, each written out as transformers writes
# them (the same prologue in each); tests/test_spanbert_model.py checks they give BERT's logits and loss.
class SpanBertForSequenceClassification(SpanBertPreTrainedModel):
    """A linear classifier on the first token ([CLS]), as in the paper's GLUE setup. MSE when `num_labels == 1`.

    A model pretrained with next sentence prediction classifies BERT's pooled `[CLS]` (the pooler NSP trained), as
    BERT does.
    """

    def __init__(self, config: SpanBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.spanbert = SpanBertModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        outputs = self.spanbert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        pooled = outputs.pooler_output if outputs.pooler_output is not None else outputs.last_hidden_state[:, 0]
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class SpanBertForQuestionAnswering(SpanBertPreTrainedModel):
    """Two independent linear classifiers for the answer's start and end (Section 4.1)."""

    def __init__(self, config: SpanBertConfig):
        super().__init__(config)
        self.spanbert = SpanBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        outputs = self.spanbert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class SpanBertForTokenClassification(SpanBertPreTrainedModel):
    def __init__(self, config: SpanBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.spanbert = SpanBertModel(config, add_pooling_layer=False)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> TokenClassifierOutput:
        outputs = self.spanbert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config, **kwargs)
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = [
    "SpanBertPreTrainedModel",
    "SpanBertModel",
    "SpanBertForPreTraining",
    "SpanBertForMaskedLM",
    "SpanBertForSequenceClassification",
    "SpanBertForQuestionAnswering",
    "SpanBertForTokenClassification",
    "SpanBoundaryHead",
    "SpanBertForPreTrainingOutput",
]
