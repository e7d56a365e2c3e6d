"""TEAMS: an ELECTRA generator + discriminator whose discriminator also learns multi-word selection (MWS).

Built from transformers' ELECTRA blocks (and with them SDPA / eager / flash attention). Faithful to the paper and,
where it is silent, to the authors' TensorFlow code (tensorflow/models, official/projects/teams):

- the generator has the discriminator's width and half its depth; its bottom half of layers ARE the discriminator's
  bottom layers (the same modules), and the two share the embeddings;
- the generator's MLM logits exist only at masked positions; from them one replacement per masked position and K
  non-original candidates (Gumbel top-k, i.e. sampling without replacement) are drawn in fp32 without gradient;
- the discriminator's RTD head is one extra transformer layer fed from layer L-1, the MWS head reads layer L and
  scores the K+1 candidates by dot product with their embedding rows: no vocabulary logits in the discriminator
  (`config.task_heads_on_layer` moves both task layers onto layer L, Table 3).
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
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.models.electra.modeling_electra import (
    ElectraClassificationHead,
    ElectraDiscriminatorPredictions,
    ElectraEmbeddings,
    ElectraGeneratorPredictions,
    ElectraLayer,
    ElectraSelfAttention,
)
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .configuration_teams import TeamsConfig


def gumbel_noise(shape, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel noise `-log(-log(u))` in fp32 (fp16 Gumbel sampling is a known ELECTRA pitfall).

    Computed in place: an `(N, V)` draw is the largest tensor of a train step, and every fresh copy of it costs a
    pass over memory (and, on CPU, page faults) that the reference's step does not pay.
    """
    # (torch.rand's draws; rand(generator=None) takes no symbolic shape under torch.compile, uniform_ does.)
    noise = torch.empty(shape, device=device, dtype=torch.float32).uniform_(generator=generator)
    tiny = torch.finfo(torch.float32).tiny
    return noise.clamp_(tiny, 1.0 - 1e-7).log_().neg_().log_().neg_()


def inverse_cdf_picks(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One index per row of `probs` `(N, V)` (non-negative, not necessarily normalised), drawn with its uniform
    `(N,)` in [0, 1): the first index whose cumulative mass exceeds u x the row's mass (never a zero-mass index)."""
    cdf = probs.cumsum(-1)
    points = uniforms[:, None].to(cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, points, right=True).clamp_(max=probs.shape[-1] - 1).squeeze(1)


@torch.no_grad()
def sample_replacements(logits: torch.Tensor, generator: torch.Generator | None = None,
                        uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from softmax(logits); it may equal the original (RTD label "original").

    With `uniforms` `(N,)` (the collator's per-example draws, `sampler_uniforms`): by inverse CDF, so a target's
    token depends on its own draw only, whatever else shares the batch. Without: Gumbel-max on this process's stream.
    The same distribution either way.
    """
    if uniforms is not None:
        return inverse_cdf_picks(logits.detach().float().softmax(-1), uniforms)
    return gumbel_noise(logits.shape, logits.device, generator).add_(logits.detach()).argmax(dim=-1)


@torch.no_grad()
def sample_candidates(
    logits: torch.Tensor,
    originals: torch.Tensor,
    num_negatives: int,
    strategy: str = "sampled",
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """Candidate sets `(N, K+1)`: the original token in column 0, then K distinct non-original tokens.

    "sampled": K draws without replacement from the generator's softmax; "hardest": the K most likely non-original
    tokens. No gradient flows through the choice. "sampled" with `uniforms` `(N, K)` draws one token at a time from
    what remains (`sample_without_replacement`), else Gumbel top-k on this process's stream: the same distribution.
    """
    if strategy == "sampled" and uniforms is not None:
        negatives = sample_without_replacement(logits, originals, uniforms[:, :num_negatives])
        return torch.cat([originals[:, None], negatives], dim=1)
    if strategy == "sampled":
        scores = gumbel_noise(logits.shape, logits.device, generator).add_(logits.detach())
    elif strategy == "hardest":
        scores = logits.detach().float().clone()
    else:
        raise ValueError(f"Unknown negative sampling strategy {strategy!r}; use 'sampled' or 'hardest'.")
    scores.scatter_(1, originals[:, None], float("-inf"))  # never the original
    negatives = scores.topk(num_negatives, dim=-1).indices
    return torch.cat([originals[:, None], negatives], dim=1)


def sample_without_replacement(logits: torch.Tensor, originals: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """`(N, K)` distinct non-original tokens, one per column of `uniforms`, each drawn by inverse CDF from the softmax
    of what is left: Plackett-Luce sampling, the law of Gumbel top-k (Kool et al., 2019).

    One softmax and one cumulative sum serve every draw: draw k takes a point in the mass not yet picked and steps
    over the picked tokens' intervals (in index order) to find its token on the full CDF.
    """
    probs = logits.detach().float().softmax(-1)
    probs.scatter_(1, originals[:, None], 0.0)  # never the original
    cdf = probs.cumsum(-1)
    # Where no fp32 mass is left (fewer tokens than K above softmax's underflow), or rounding lands on a picked
    # token: the most likely token not yet picked, the one Gumbel top-k picks all but surely.
    likeliest = logits.detach().float().scatter(1, originals[:, None], float("-inf")).topk(uniforms.shape[1]).indices
    picks, picked_mass = likeliest[:, :0], torch.zeros_like(cdf[:, 0])
    for column in range(uniforms.shape[1]):
        point = uniforms[:, column].to(cdf.dtype) * (cdf[:, -1] - picked_mass)
        for index in picks.sort(dim=1).values.unbind(1):  # step over each picked interval at or below the point
            mass = probs.gather(1, index[:, None]).squeeze(1)
            start = cdf.gather(1, index[:, None]).squeeze(1) - mass
            point = torch.where(point >= start, point + mass, point)
        pick = torch.searchsorted(cdf, point[:, None], right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(1)
        mass = probs.gather(1, pick[:, None]).squeeze(1)
        valid = (mass > 0) & (pick[:, None] != picks).all(-1)
        free = (likeliest[:, :, None] != picks[:, None, :]).all(-1)
        fallback = likeliest.gather(1, free.to(torch.int8).argmax(-1, keepdim=True)).squeeze(1)
        pick = torch.where(valid, pick, fallback)
        picked_mass = picked_mass + probs.gather(1, pick[:, None]).squeeze(1)
        picks = torch.cat([picks, pick[:, None]], dim=1)
    return picks


# Copied from models.spanbert.modeling_spanbert.bidirectional_attention_mask
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


# Copied from models.spanbert.modeling_spanbert.varlen_attention_forward
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


# Copied from models.spanbert.modeling_spanbert.flash_varlen_attention
def flash_varlen_attention(query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, dropout,
                           scaling) -> torch.Tensor:
    """PyTorch's varlen flash kernel, `(tokens, heads, head_dim)` in and out, non-causal, with attention dropout (its
    backward replays the forward's dropout mask from the returned RNG state; autograd knows the op)."""
    return torch.ops.aten._flash_attention_forward(
        query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, dropout, False, False,
        scale=scaling,
    )[0]


# Copied from models.spanbert.modeling_spanbert.runs_unpadded
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


# Copied from models.spanbert.modeling_spanbert.unpad_batch
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


# Copied from models.spanbert.modeling_spanbert.pad_back
def pad_back(values: torch.Tensor, flat: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
    """`values` `(1, tokens)` of an unpadded batch put back into the padded shape, over a copy of `padded`."""
    out = padded.clone().flatten()
    out[flat] = values[0].to(out.dtype)
    return out.view(padded.shape)


# Copied from models.spanbert.modeling_spanbert.buffer_slots
def buffer_slots(target_positions: torch.Tensor):
    """Rows, columns and validity of a fixed-size target buffer `(B, K)` (positions, -1 for an empty slot), flat.
    Empty slots point at column 0 ([CLS], never a target), so every gather stays in bounds without a host sync."""
    rows = torch.arange(target_positions.shape[0], device=target_positions.device)[:, None]
    return (rows.expand_as(target_positions).flatten(), target_positions.clamp(min=0).flatten(),
            (target_positions >= 0).flatten())


# Copied from models.spanbert.modeling_spanbert.use_varlen_attention
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


# Copied from models.spanbert.modeling_spanbert.layer_at_positions
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


@dataclass
class TeamsModelOutput(ModelOutput):
    """
    last_hidden_state: the fine-tuning representation (`config.finetune_representation`).
    """

    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class TeamsForPreTrainingOutput(ModelOutput):
    """
    loss: `mlm_loss_weight * mlm + rtd_loss_weight * rtd + mws_loss_weight * mws`.
    mlm_loss / mws_loss: means over masked positions. rtd_loss: mean over non-padding tokens.
    rtd_accuracy / mws_accuracy / mlm_accuracy: detached accuracies for logging.
    mlm_logits: `(num_masked, vocab_size)`, generator logits only at masked positions (row-major order); with
        `target_positions`, one row per buffer slot (as `mws_logits` and `candidate_ids`).
    rtd_logits: `(B, T)` "replaced" logits. rtd_labels: `(B, T)` 1.0 where the corrupted token differs from the
        original.
    mws_logits: `(num_masked, K+1)` candidate scores; the original is candidate 0.
    Without labels (inference) only the discriminator runs on `input_ids` as given: `rtd_logits` `(B, T)`, and
    with `candidate_ids` `(B, T, K)` the MWS scores `mws_logits` `(B, T, K)`.
    corrupted_input_ids: `(B, T)` the discriminator's input. candidate_ids: `(num_masked, K+1)`.
    hidden_states / attentions: the discriminator trunk's (embeddings and layers 1..L, on the corrupted input when
        training), with `output_hidden_states` / `output_attentions`.
    """

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    rtd_loss: torch.Tensor | None = None
    mws_loss: torch.Tensor | None = None
    mlm_accuracy: torch.Tensor | None = None
    rtd_accuracy: torch.Tensor | None = None
    mws_accuracy: torch.Tensor | None = None
    mlm_logits: torch.Tensor | None = None
    rtd_logits: torch.Tensor | None = None
    rtd_labels: torch.Tensor | None = None
    mws_logits: torch.Tensor | None = None
    corrupted_input_ids: torch.Tensor | None = None
    candidate_ids: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class TeamsDiscriminatorOutput(ModelOutput):
    """The discriminator trunk's top layer, the input of the task layer(s), and what was recorded."""

    last_hidden_state: torch.Tensor | None = None
    task_input: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def mean_over(hits: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """The fraction of `hits` (bool) among the `valid` entries (all without), as a tensor: no host sync."""
    if valid is None:
        return hits.float().mean()
    return (hits & valid).sum() / valid.sum()


def records_outputs(config, kwargs: dict) -> bool:
    """Whether the call asks for hidden states or attentions (then the layers run whole, where hooks record them)."""
    return any(kwargs.get(name, getattr(config, name)) for name in ("output_hidden_states", "output_attentions"))


class TeamsPreTrainedModel(PreTrainedModel):
    config_class = TeamsConfig
    config: TeamsConfig
    base_model_prefix = "teams"
    supports_gradient_checkpointing = True
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["ElectraEmbeddings", "ElectraLayer"]
    _can_record_outputs = {"hidden_states": ElectraLayer, "attentions": ElectraSelfAttention}

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, TeamsGenerator):
            init.zeros_(module.bias)
        elif isinstance(module, ElectraEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)


class TeamsModel(TeamsPreTrainedModel):
    """The discriminator encoder: what fine-tuning uses.

    By default it returns the MWS head's input: layer L, or with `config.task_heads_on_layer="last"` the extra MWS
    layer on top of it. With `config.finetune_representation="rtd"` it returns the RTD task layer's outputs instead
    (layers 1..`config.task_source_layer`, then the RTD layer).

    `with_all_task_layers=True` (pretraining) builds every task layer; by default only the one fine-tuning reads.
    """

    # A pretraining export also holds the generator, the RTD and MWS heads and the task layer fine-tuning does not
    # read: loading it here is no mismatch. transformers adds these patterns to every model that holds this one (the
    # task heads); any other key that does not fit is still reported.
    _keys_to_ignore_on_load_unexpected = [r"^generator\.", r"^rtd_head\.", r"^mws_head\.", r"^(teams\.)?rtd_layer\.",
                                          r"^(teams\.)?mws_layer\."]

    def __init__(self, config: TeamsConfig, with_all_task_layers: bool = False):
        super().__init__(config)
        self.embeddings = ElectraEmbeddings(config)
        # Factorised embeddings (128 -> 256 for small).
        self.embeddings_project = (
            nn.Linear(config.embedding_size, config.hidden_size)
            if config.embedding_size != config.hidden_size else None
        )
        self.layer = nn.ModuleList([ElectraLayer(config, layer_idx=i) for i in range(config.num_hidden_layers)])
        reads_rtd = config.finetune_representation == "rtd"
        self.rtd_layer = (
            ElectraLayer(config, layer_idx=config.num_hidden_layers)
            if (with_all_task_layers or reads_rtd) and config.has_rtd_task_layer
            else None
        )
        self.mws_layer = (
            ElectraLayer(config, layer_idx=config.num_hidden_layers + 1)
            if (with_all_task_layers or not reads_rtd) and config.has_mws_task_layer
            else None
        )
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def embed(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None, project: bool = True):
        """Embeddings (checked against the position table), projected to the hidden size unless `project=False`
        (a narrower generator projects them itself)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        sequence_length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        # A packed row may be longer than the position table: its position_ids restart with every sequence.
        if position_ids is None and sequence_length > self.config.max_position_embeddings:
            raise ValueError(
                f"Input has {sequence_length} tokens but this model has {self.config.max_position_embeddings} "
                "positions; truncate the input (e.g. tokenizer(..., truncation=True, max_length=...))."
            )
        hidden = self.embeddings(
            input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids, inputs_embeds=inputs_embeds
        )
        return self.embeddings_project(hidden) if project and self.embeddings_project is not None else hidden

    def attention_mask_for(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, position_ids=None):
        return self.mask_and_layer_kwargs(hidden, attention_mask, position_ids)[0]

    def mask_and_layer_kwargs(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, position_ids=None,
                              **kwargs):
        """The attention mask and the kwargs for the layers (with `position_ids` for a packed batch, see
        `bidirectional_attention_mask`); none for unpadded sequences (`runs_unpadded`)."""
        if runs_unpadded(self.config, attention_mask, kwargs):
            return None, {"position_ids": position_ids, **kwargs}
        mask, packed = bidirectional_attention_mask(self.config, hidden, attention_mask, position_ids)
        return mask, ({"position_ids": position_ids, **kwargs} if packed else kwargs)

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
    ) -> TeamsModelOutput:
        r"""
        position_ids: with `attention_mask=None`, positions that restart at 0 mark sequences packed into one row
            (see `bidirectional_attention_mask`); pass `cu_seq_lens_q/k` and `max_length_q/k` too for flash attention.
        """
        hidden = self.embed(input_ids, token_type_ids, position_ids, inputs_embeds)
        mask, kwargs = self.mask_and_layer_kwargs(hidden, attention_mask, position_ids, **kwargs)
        from_rtd = self.config.finetune_representation == "rtd"
        for layer in self.layer[: self.config.task_source_layer] if from_rtd else self.layer:
            hidden = layer(hidden, mask, **kwargs)
        if from_rtd:
            hidden = self.rtd_layer(hidden, mask, **kwargs)
        elif self.mws_layer is not None:
            hidden = self.mws_layer(hidden, mask, **kwargs)
        return TeamsModelOutput(last_hidden_state=hidden)


class TeamsGenerator(nn.Module):
    """The generator's own parts: its top layers (the bottom ones are borrowed from the discriminator), the MLM
    head, and the output bias; the output weights are the shared word embeddings."""

    def __init__(self, config: TeamsConfig):
        super().__init__()
        generator_config = config
        if config.generator_hidden_size != config.hidden_size:  # ELECTRA's narrower generator
            generator_config = config.__class__(
                **{
                    **config.to_dict(),
                    "hidden_size": config.generator_hidden_size,
                    "intermediate_size": config.generator_intermediate_size,
                    "num_attention_heads": config.generator_num_attention_heads,
                    "auto_map": None,
                }
            )
            generator_config._attn_implementation = config._attn_implementation
        # With the discriminator's width the generator also shares its embedding projection.
        self.embeddings_project = (
            nn.Linear(config.embedding_size, config.generator_hidden_size)
            if config.generator_hidden_size != config.hidden_size
            and config.embedding_size != config.generator_hidden_size
            else None
        )
        own = config.generator_num_hidden_layers - config.num_shared_generator_layers
        self.layer = nn.ModuleList(
            [ElectraLayer(generator_config, layer_idx=config.num_shared_generator_layers + i) for i in range(own)]
        )
        self.predictions = ElectraGeneratorPredictions(generator_config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # Weight tied to the word embeddings and bias to `bias` (BertLMPredictionHead's convention), so
        # resize_token_embeddings resizes both.
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size)


class TeamsGeneratorMixin:
    """The generator's forward pass, shared by `TeamsForPreTraining` and `TeamsForMaskedLM` (same weight names)."""

    _tied_weights_keys = {
        "generator.decoder.weight": "teams.embeddings.word_embeddings.weight",
        "generator.decoder.bias": "generator.bias",
    }

    def generator_layers(self) -> list[nn.Module]:
        """The generator's layers bottom-up: the shared discriminator layers first (the same module objects)."""
        return [*self.teams.layer[: self.config.num_shared_generator_layers], *self.generator.layer]

    def generator_embeddings_project(self) -> nn.Module | None:
        if self.config.generator_hidden_size == self.config.hidden_size:
            return self.teams.embeddings_project
        return self.generator.embeddings_project

    def generator_below_top(self, input_ids, attention_mask, token_type_ids, position_ids, **kwargs):
        """The generator up to (not including) its top layer: its hidden states, the attention mask, the layer
        kwargs, and the top layer (run at every position or only at the targets by the caller)."""
        hidden = self.teams.embed(input_ids, token_type_ids, position_ids, project=False)
        project = self.generator_embeddings_project()
        hidden = project(hidden) if project is not None else hidden
        mask, kwargs = self.teams.mask_and_layer_kwargs(hidden, attention_mask, position_ids, **kwargs)
        *lower, top_layer = self.generator_layers()
        for layer in lower:
            hidden = layer(hidden, mask, **kwargs)
        return hidden, mask, kwargs, top_layer

    def get_output_embeddings(self):
        return self.generator.decoder

    def set_output_embeddings(self, new_embeddings):
        self.generator.decoder = new_embeddings


class TeamsMultiWordSelectionHead(nn.Module):
    """Dense(embedding_size, gelu) -> LayerNorm; candidates are scored by dot product with their embedding rows."""

    def __init__(self, config: TeamsConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.activation = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, candidate_embeddings: torch.Tensor) -> torch.Tensor:
        """hidden `(N, H)`, candidate_embeddings `(N, K+1, E)` -> scores `(N, K+1)`."""
        query = self.LayerNorm(self.activation(self.dense(hidden)))
        return torch.einsum("ne,nke->nk", query, candidate_embeddings)


class TeamsForPreTraining(TeamsGeneratorMixin, TeamsPreTrainedModel):
    """Generator (MLM) + discriminator (RTD and/or MWS). With `pretraining_tasks="rtd"`, `task_head_type="ffn"`,
    `layer_tying="none"` and a narrower generator it is ELECTRA on the same code path (`--model electra`)."""

    # Reads sequences packed into one row (position_ids restarting at 0, no attention_mask): training.packing.
    _supports_packed_sequences = True
    # The pretraining loss is a fixed mean per objective; Trainer must not rescale it by its token count.
    accepts_loss_kwargs = False

    def __init__(self, config: TeamsConfig):
        super().__init__(config)
        self.teams = TeamsModel(config, with_all_task_layers=True)
        self.generator = TeamsGenerator(config)
        self.rtd_head = ElectraDiscriminatorPredictions(config) if config.trains_rtd else None
        self.mws_head = TeamsMultiWordSelectionHead(config) if config.trains_mws else None
        self.post_init()
        use_varlen_attention(self)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        candidate_ids: torch.Tensor | None = None,
        target_positions: torch.Tensor | None = None,
        sampler_uniforms: torch.Tensor | None = None,
        **kwargs,
    ) -> TeamsForPreTrainingOutput:
        r"""
        input_ids: `(B, T)` the masked input x^M (from a masked-LM collator); without labels, the text to score.
        labels: `(B, T)` original token ids at masked positions, -100 elsewhere. Without labels the discriminator
            scores `input_ids` as given (ElectraForPreTraining's inference): `rtd_logits`, and `mws_logits` for
            `candidate_ids`.
        candidate_ids: inference only, `(B, T, K)` candidate token ids to score at every position with the MWS head.
        position_ids: with `attention_mask=None`, positions restarting at 0 mark sequences packed into one row
            (`training.packing.PackedBatchCollator`); RTD then averages over every token of the row.
        target_positions: with `labels`, the fixed-size target buffer (`SpanMaskingCollator(target_buffer=True)`):
            `(B, K)` each row's masked positions, ascending, then -1. The step then has no data-dependent shape (no
            host sync): `mlm_logits`, `mws_logits` and `candidate_ids` have one row per slot (`B * K`), and empty
            slots are left out of the losses and accuracies. The same losses as without it for the same draws (the
            samplers draw noise for every slot, so a run's draws differ from a run without it).

        sampler_uniforms: with `labels`, `(B, T, D)` uniform draws in [0, 1) per position (`SpanMaskingCollator(
            sampler_draws=config.sampler_draws)`, keyed by example and position): the replacement of a masked token
            and its MWS candidates are drawn from its own draws, so they do not depend on what shares its batch
            (any split of a global batch corrupts it the same way). Without, the samplers draw Gumbel noise from this
            process's torch stream.

        With `config.unpad` a padded batch is flattened into one row of its real tokens first (`unpad_batch`); the
        per-token outputs come back padded.
        """
        if target_positions is not None and labels is None:
            raise ValueError("target_positions lists where the labels are (the fixed-size target buffer); pass labels "
                             "too.")
        if labels is None:
            return self.discriminate(input_ids, attention_mask, token_type_ids, position_ids, candidate_ids, **kwargs)
        if self.config.unpad and attention_mask is not None and not records_outputs(self.config, kwargs):
            return self.unpadded_forward(input_ids, attention_mask, token_type_ids, position_ids, labels,
                                         target_positions, sampler_uniforms, **kwargs)
        if target_positions is not None:
            targets = self.buffered_targets(input_ids, labels, target_positions)
        else:
            targets = self.padded_targets(labels, attention_mask)
        uniforms = self.target_uniforms(sampler_uniforms, *targets[:2])
        return self.pretraining_step(input_ids, attention_mask, token_type_ids, position_ids, *targets,
                                     uniforms=uniforms, **kwargs)

    def unpadded_forward(self, input_ids, attention_mask, token_type_ids, position_ids, labels, target_positions,
                         sampler_uniforms=None, **kwargs) -> TeamsForPreTrainingOutput:
        """`forward` with `config.unpad`: the padded batch flattened into one row of its real tokens (`unpad_batch`),
        run as that packed row, and the per-token outputs padded back."""
        packed, flat = unpad_batch(
            attention_mask, per_token=dict(input_ids=input_ids, labels=labels, token_type_ids=token_type_ids,
                                           position_ids=position_ids, sampler_uniforms=sampler_uniforms),
            boundaries={}, targets=dict(target_positions=target_positions),
        )
        output = self(**packed, **kwargs)
        # The padding back where an output has the padded shape.
        output["corrupted_input_ids"] = pad_back(output.corrupted_input_ids, flat, input_ids)
        if output.rtd_logits is not None:
            zeros = input_ids.new_zeros(input_ids.shape, dtype=output.rtd_logits.dtype)
            output["rtd_logits"] = pad_back(output.rtd_logits, flat, zeros)
            output["rtd_labels"] = pad_back(output.rtd_labels, flat, zeros.float())
        return output

    def target_uniforms(self, sampler_uniforms, rows, cols):
        """The collator's draws at the targets `(N, D)`; None without them. Refuses fewer draws than the samplers
        read (a shape, known without a host sync)."""
        if sampler_uniforms is None:
            return None
        if sampler_uniforms.shape[-1] < self.config.sampler_draws:
            raise ValueError(f"sampler_uniforms has {sampler_uniforms.shape[-1]} draws per position; this model's "
                             f"samplers read {self.config.sampler_draws} (config.sampler_draws): build the collator "
                             f"with sampler_draws={self.config.sampler_draws}.")
        return sampler_uniforms[rows, cols]

    def buffered_targets(self, input_ids, labels, target_positions):
        """The fixed-size target buffer's slots: a fixed number of them, so no data-dependent shape and no host sync.
        Returns rows, columns, validity, None (RTD weighs out the padding), original ids and MLM targets."""
        rows, cols, valid = buffer_slots(target_positions)
        originals = torch.where(valid, labels[rows, cols], input_ids[rows, cols])
        return rows, cols, valid, None, originals, torch.where(valid, originals, -100)

    def padded_targets(self, labels, attention_mask):
        """A padded batch's (or packed row's) targets, gathered: rows, columns, None (every one is valid), the real
        tokens RTD reads (None without padding or RTD), original ids and MLM targets (the same)."""
        # The data-dependent index sets first: under torch.compile they split the graph before the encoder.
        rows, cols = (labels != -100).nonzero(as_tuple=True)
        real = (attention_mask.nonzero(as_tuple=True)
                if attention_mask is not None and self.rtd_head is not None else None)
        originals = labels[rows, cols]
        return rows, cols, None, real, originals, originals

    def pretraining_step(self, input_ids, attention_mask, token_type_ids, position_ids, rows, cols, valid, real,
                         originals, mlm_targets, uniforms=None, **kwargs) -> TeamsForPreTrainingOutput:
        """Generator, corruption and discriminator at the targets `(rows, cols)`; `valid` marks the buffer's filled
        slots (None: every target is), `real` the real tokens RTD averages over (None: every token, or weighed),
        `uniforms` `(N, config.sampler_draws)` the targets' draws (None: the samplers use this process's stream)."""
        config = self.config
        word_embeddings = self.teams.embeddings.word_embeddings.weight
        # Collected here, built at the end: a ModelOutput orders its tuple by when each field was set.
        output = {}

        # Generator: MLM on the masked input, logits only at masked positions. Generator and discriminator see the
        # same padding (or packing), so one mask serves both.
        hidden, mask, kwargs, top_layer = self.generator_below_top(
            input_ids, attention_mask, token_type_ids, position_ids, **kwargs
        )
        at_targets = layer_at_positions(top_layer, hidden, mask, rows, cols, **kwargs)
        output["mlm_logits"] = self.generator.decoder(self.generator.predictions(at_targets))
        mlm_logits = output["mlm_logits"].float()  # once: the loss and both samplers work in fp32
        output["mlm_loss"] = F.cross_entropy(mlm_logits, mlm_targets)
        output["mlm_accuracy"] = mean_over(mlm_logits.detach().argmax(-1) == originals, valid)
        loss = config.mlm_loss_weight * output["mlm_loss"]

        # Corrupt the input with one sampled replacement per masked position (no gradient, fp32).
        replacements = sample_replacements(mlm_logits, uniforms=None if uniforms is None else uniforms[:, 0])
        if valid is not None:  # an empty slot keeps its token (it points at [CLS])
            replacements = torch.where(valid, replacements, originals)
        original_ids = input_ids.clone()
        original_ids[rows, cols] = originals
        corrupted = original_ids.clone()
        corrupted[rows, cols] = replacements
        output["corrupted_input_ids"] = corrupted

        # Discriminator on the corrupted input.
        trunk = self.discriminator_trunk(corrupted, mask, token_type_ids, position_ids, **kwargs)
        top, task_input = trunk.last_hidden_state, trunk.task_input
        output.update(hidden_states=trunk.hidden_states, attentions=trunk.attentions)

        if self.rtd_head is not None:
            rtd_states = self.teams.rtd_layer(task_input, mask, **kwargs) if self.teams.rtd_layer is not None else top
            output["rtd_logits"] = rtd_logits = self.rtd_head(rtd_states)
            output["rtd_labels"] = rtd_labels = (corrupted != original_ids).float()
            if real is not None:  # RTD over real tokens only (a packed batch has no padding)
                rtd_logits, rtd_labels = rtd_logits[real], rtd_labels[real]
            rtd_logits = rtd_logits.float()
            if valid is not None and attention_mask is not None:  # the buffer's step weighs out the padding instead
                weights = attention_mask.to(rtd_logits.dtype)
                output["rtd_loss"] = F.binary_cross_entropy_with_logits(rtd_logits, rtd_labels, weights,
                                                                        reduction="sum") / weights.sum()
                output["rtd_accuracy"] = mean_over((rtd_logits.detach() > 0).float() == rtd_labels, weights.bool())
            else:
                output["rtd_loss"] = F.binary_cross_entropy_with_logits(rtd_logits, rtd_labels)
                output["rtd_accuracy"] = ((rtd_logits.detach() > 0).float() == rtd_labels).float().mean()
            loss = loss + config.rtd_loss_weight * output["rtd_loss"]

        if self.mws_head is not None:
            candidate_ids = sample_candidates(mlm_logits, originals, config.num_negatives, config.negative_sampling,
                                              uniforms=None if uniforms is None else uniforms[:, 1:])
            output["candidate_ids"] = candidate_ids
            if self.teams.mws_layer is not None:
                mws_states = layer_at_positions(self.teams.mws_layer, top, mask, rows, cols, **kwargs)
            else:
                mws_states = top[rows, cols]
            output["mws_logits"] = mws_logits = self.mws_head(mws_states, word_embeddings[candidate_ids])
            target = torch.zeros_like(originals)  # the original is candidate 0
            if valid is not None:
                target = torch.where(valid, target, -100)
            output["mws_loss"] = F.cross_entropy(mws_logits.float(), target)
            output["mws_accuracy"] = mean_over(mws_logits.detach().argmax(-1) == 0, valid)
            loss = loss + config.mws_loss_weight * output["mws_loss"]
        return TeamsForPreTrainingOutput(loss=loss, **output)

    def discriminator_trunk(self, input_ids, mask, token_type_ids=None, embedding_position_ids=None, **kwargs):
        """Layers 1..L of the discriminator on `input_ids`; hidden states and attentions recorded when asked for.
        `kwargs` go to the layers (with `position_ids` for a packed batch, see `mask_and_layer_kwargs`)."""
        if records_outputs(self.config, kwargs):
            return self._recorded_discriminator_trunk(input_ids, mask, token_type_ids, embedding_position_ids, **kwargs)
        return self._discriminator_trunk(input_ids, mask, token_type_ids, embedding_position_ids, **kwargs)

    def _discriminator_trunk(self, input_ids, mask, token_type_ids=None, embedding_position_ids=None, **kwargs):
        hidden = self.teams.embed(input_ids, token_type_ids, embedding_position_ids)
        task_input = None
        for index, layer in enumerate(self.teams.layer, start=1):
            hidden = layer(hidden, mask, **kwargs)
            if index == self.config.task_source_layer:
                task_input = hidden
        return TeamsDiscriminatorOutput(last_hidden_state=hidden, task_input=task_input)

    # Only on request: the recording hooks stay out of the compiled training step.
    _recorded_discriminator_trunk = capture_outputs(_discriminator_trunk)

    def discriminate(self, input_ids, attention_mask, token_type_ids, position_ids, candidate_ids, **kwargs):
        """Inference: the discriminator's scores of `input_ids` as given (no generator, no corruption)."""
        if candidate_ids is not None and self.mws_head is None:
            raise ValueError("candidate_ids needs the MWS head; this model was pretrained without MWS (rtd only).")
        hidden = self.teams.embed(input_ids, token_type_ids, position_ids)
        mask, kwargs = self.teams.mask_and_layer_kwargs(hidden, attention_mask, position_ids, **kwargs)
        trunk = self.discriminator_trunk(input_ids, mask, token_type_ids, position_ids, **kwargs)
        output = {}
        if self.rtd_head is not None:
            rtd_layer = self.teams.rtd_layer
            rtd_states = (rtd_layer(trunk.task_input, mask, **kwargs) if rtd_layer is not None
                          else trunk.last_hidden_state)
            output["rtd_logits"] = self.rtd_head(rtd_states)
        if candidate_ids is not None:
            top = trunk.last_hidden_state
            mws_states = self.teams.mws_layer(top, mask, **kwargs) if self.teams.mws_layer is not None else top
            batch, length, num_candidates = candidate_ids.shape
            candidates = self.teams.embeddings.word_embeddings(candidate_ids).flatten(0, 1)
            scores = self.mws_head(mws_states.flatten(0, 1), candidates)
            output["mws_logits"] = scores.view(batch, length, num_candidates)
        return TeamsForPreTrainingOutput(**output, hidden_states=trunk.hidden_states, attentions=trunk.attentions)


class TeamsForMaskedLM(TeamsGeneratorMixin, TeamsPreTrainedModel):
    """The generator as a masked LM (`pipeline("fill-mask")`); loads the `teams.*`/`generator.*` weights of a
    `TeamsForPreTraining` export. Without labels `logits` are `(B, T, vocab_size)`; with labels, logits only at the
    labelled positions `(num_labelled, vocab_size)` (row-major) and their mean cross-entropy."""

    # A pretraining export also holds the discriminator's task heads; the generator does not read them.
    _keys_to_ignore_on_load_unexpected = [r"^rtd_head\.", r"^mws_head\."]

    def __init__(self, config: TeamsConfig):
        super().__init__(config)
        # A config's `gradient_checkpointing` is consumed by the first post_init (TeamsModel's): keep it for all.
        checkpointing = getattr(config, "gradient_checkpointing", False)
        self.teams = TeamsModel(config)
        self.generator = TeamsGenerator(config)
        # Only the discriminator layers the generator shares run here (and its embedding projection when the
        # generator has the discriminator's width); the others would be parameters without a gradient.
        shared = config.num_shared_generator_layers
        del self.teams.layer[shared:]
        self.teams.rtd_layer = self.teams.mws_layer = None
        if config.generator_hidden_size != config.hidden_size:
            self.teams.embeddings_project = None
        self.post_init()
        if checkpointing:
            self.gradient_checkpointing_enable()
        # A pretraining export's other discriminator weights are not read.
        self._keys_to_ignore_on_load_unexpected.update(
            {rf"^teams\.layer\.(?!({'|'.join(map(str, range(shared)))})\.)" if shared else r"^teams\.layer\.",
             r"^teams\.rtd_layer\.", r"^teams\.mws_layer\."}
            | ({r"^teams\.embeddings_project\."} if self.teams.embeddings_project is None else set())
        )

    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> MaskedLMOutput:
        r"""
        hidden_states / attentions (with `output_hidden_states` / `output_attentions`): the generator's, i.e. the
        shared discriminator layers' and then its own.
        """
        hidden, mask, kwargs, top_layer = self.generator_below_top(
            input_ids, attention_mask, token_type_ids, position_ids, **kwargs
        )
        if labels is None:
            logits = self.generator.decoder(self.generator.predictions(top_layer(hidden, mask, **kwargs)))
            return MaskedLMOutput(logits=logits)
        rows, cols = (labels != -100).nonzero(as_tuple=True)
        if records_outputs(self.config, kwargs):  # the whole top layer, where the hooks record it
            at_targets = top_layer(hidden, mask, **kwargs)[rows, cols]
        else:
            at_targets = layer_at_positions(top_layer, hidden, mask, rows, cols, **kwargs)
        logits = self.generator.decoder(self.generator.predictions(at_targets))
        return MaskedLMOutput(loss=F.cross_entropy(logits.float(), labels[rows, cols]), logits=logits)


class TeamsForSequenceClassification(TeamsPreTrainedModel):
    """ELECTRA's classification head (dense, GeLU, projection) on the first token. MSE when `num_labels == 1`."""

    def __init__(self, config: TeamsConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.teams = TeamsModel(config)
        self.classifier = ElectraClassificationHead(config)
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
        outputs = self.teams(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class TeamsForQuestionAnswering(TeamsPreTrainedModel):
    """Start and end logits from one linear layer over every token."""

    def __init__(self, config: TeamsConfig):
        super().__init__(config)
        self.teams = TeamsModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    # Copied from models.spanbert.modeling_spanbert.SpanBertForQuestionAnswering.forward with spanbert->teams
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
        outputs = self.teams(
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


class TeamsForTokenClassification(TeamsPreTrainedModel):
    def __init__(self, config: TeamsConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.teams = TeamsModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    # Copied from models.spanbert.modeling_spanbert.SpanBertForTokenClassification.forward with spanbert->teams
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
        outputs = self.teams(
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
    "TeamsPreTrainedModel",
    "TeamsModel",
    "TeamsForPreTraining",
    "TeamsForMaskedLM",
    "TeamsForSequenceClassification",
    "TeamsForQuestionAnswering",
    "TeamsForTokenClassification",
    "TeamsForPreTrainingOutput",
    "sample_candidates",
    "sample_replacements",
]
