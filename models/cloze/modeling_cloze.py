"""Two-tower cloze model: a forward and a backward transformer tower combined by one attention layer.

Every token is predicted from the forward states left of it and the backward states right of it (the cloze
objective); fine-tuning lifts the combination mask so the outputs also see the token itself. All masks are 4D
additive masks handed to transformers' attention interface (SDPA by default, eager on request).
"""

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple

from .configuration_cloze import COMBINATION_MASKS, TwoTowerClozeConfig


@dataclass
class TwoTowerClozeModelOutput(ModelOutput):
    """
    last_hidden_state: `(B, T, d)` combination outputs (the representations `f` before the softmax).
    forward_states / backward_states: `(B, T, d)` final (layer-normalised) states of each tower, returned with
        `output_tower_states=True`.
    hidden_states: with `output_hidden_states=True`, `num_hidden_layers + 1` tensors `(B, T, 2d)`: the
        concatenated forward and backward states after each block (index 0: the shared embeddings, twice).
    """

    last_hidden_state: torch.Tensor | None = None
    forward_states: torch.Tensor | None = None
    backward_states: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class TwoTowerClozeOutput(ModelOutput):
    """
    loss: the objective of `config.loss_type`: cloze, bilm, or cloze + bilm_loss_weight * bilm.
    cloze_loss: mean cross-entropy of the combination layer's predictions over the labelled tokens.
    bilm_loss: mean of the two directions' mean cross-entropies (forward tower at i-1 and backward tower at i+1
        predicting token i).
    logits: `(num_labelled_tokens, vocab_size)` cloze logits, one row per `labels != -100` (or `prediction_mask`)
        position in row-major order; `(B, T, vocab_size)` at every position without either. Log-probabilities with
        the adaptive softmax (which, training, skips them: the loss needs no full-vocabulary softmax).
    forward_logits / backward_logits: bilm logits, one row per labelled position that has a real left (right)
        neighbour, row-major order; without labels, see `TwoTowerCloze.forward`.
    hidden_states: as in `TwoTowerClozeModelOutput`.
    """

    loss: torch.Tensor | None = None
    cloze_loss: torch.Tensor | None = None
    bilm_loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    forward_logits: torch.Tensor | None = None
    backward_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """fairseq's fixed table: sines in the first half of the channels, cosines in the second."""
    half = dim // 2
    frequencies = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(num_positions, dtype=torch.float)[:, None] * frequencies[None]
    table = torch.cat([angles.sin(), angles.cos()], dim=1)
    return F.pad(table, (0, dim % 2))


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`(B, Tq, Tk)` boolean -> `(B, 1, Tq, 1 + Tk)` additive mask whose first key, the zero state, is always open."""
    allowed = torch.cat([allowed.new_ones(*allowed.shape[:-1], 1), allowed], dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def combination_visibility(attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """`(B, T, 2T)` boolean: which forward (first T) and backward (last T) states query i may attend to."""
    if mode not in COMBINATION_MASKS:
        raise ValueError(f"combination_mask={mode!r}; choose one of {', '.join(map(repr, COMBINATION_MASKS))}.")
    length = attention_mask.shape[1]
    i = torch.arange(length, device=attention_mask.device)[:, None]
    j = torch.arange(length, device=attention_mask.device)[None, :]
    if mode == "cloze":  # pretraining: nothing that has seen token i
        forward, backward = j < i, j > i
    elif mode == "curr":
        forward, backward = j <= i, j >= i
    else:
        forward = backward = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device)
    keys = torch.cat([attention_mask, attention_mask], dim=1)[:, None, :]
    return torch.cat([forward, backward], dim=1)[None] & keys


class TwoTowerClozeHighwayGate(nn.Linear):
    """`W_g x + b_g` of a highway layer; `_init_weights` starts its bias at 1 (its own class, so the init holds on
    any load path)."""


class TwoTowerClozeHighway(nn.Module):
    """`g * x + (1 - g) * ReLU(W_h x + b_h)` with `g = sigmoid(W_g x + b_g)` (Srivastava et al., 2015, as fairseq's
    `Highway`); the gate's bias starts at 1, so the layer starts close to carrying its input (as fairseq)."""

    def __init__(self, size: int):
        super().__init__()
        self.transform = nn.Linear(size, size)
        self.gate = TwoTowerClozeHighwayGate(size, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.gate(x))
        return gate * x + (1 - gate) * F.relu(self.transform(x))


class TwoTowerClozeCharacterCNN(nn.Module):
    """Word vectors from the bytes of each word (Kim et al., 2016; fairseq's `CharacterTokenEmbedder`): byte
    embeddings, one convolution per filter width, max-pooled over the word and rectified, concatenated, highway
    layers, then a projection to the model width.

    The model still takes word ids: `word_characters` (a buffer saved with the weights, so an export is
    self-contained) spells word `w` as UTF-8 bytes + 1, 0-padded to `max_word_characters`. Fill it with
    `set_word_vocabulary`; special tokens are spelled out like any word (`[CLS]`, `[UNK]`, ...).
    """

    num_characters = 257  # 0 is padding, 1..256 are the bytes

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__()
        self.register_buffer(
            "word_characters", torch.zeros(config.vocab_size, config.max_word_characters, dtype=torch.int16)
        )
        self.character_embeddings = nn.Embedding(self.num_characters, config.character_embedding_size, padding_idx=0)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(config.character_embedding_size, channels, width) for width, channels in config.character_filters
        )
        width = sum(channels for _, channels in config.character_filters)
        self.highways = nn.ModuleList(TwoTowerClozeHighway(width) for _ in range(config.highway_layers))
        self.projection = nn.Linear(width, config.hidden_size)

    @property
    def num_embeddings(self) -> int:
        """Words the table spells (`config.vocab_size`), as `nn.Embedding.num_embeddings`."""
        return self.word_characters.shape[0]

    @staticmethod
    def spell(words: list[str], rows: int, length: int) -> tuple[torch.Tensor, int]:
        """`(rows, length)` int16 table spelling `words[i]` in row i (UTF-8 bytes + 1, 0-padded; rows past the words
        stay all padding), and how many words were longer than `length`."""
        table = torch.zeros(rows, length, dtype=torch.int16)
        truncated = 0
        for index, word in enumerate(words):
            spelled = [byte + 1 for byte in word.encode("utf-8")]
            truncated += len(spelled) > length
            table[index, : min(len(spelled), length)] = torch.tensor(spelled[:length], dtype=torch.int16)
        return table, truncated

    @torch.no_grad()
    def set_word_vocabulary(self, words: list[str]) -> int:
        """Spell `words[i]` into row i of the table; returns how many words were longer than the table is wide."""
        rows, length = self.word_characters.shape
        if len(words) > rows:
            raise ValueError(f"{len(words)} words do not fit a vocabulary of {rows} (config.vocab_size).")
        table, truncated = self.spell(words, rows, length)
        self.word_characters.copy_(table)
        return truncated

    @torch.no_grad()
    def resize(self, rows: int, new_words: list[str] | None = None) -> None:
        """Keep the first `rows` spellings; rows added past the old table are spelled from `new_words` (in order),
        and those without a word are left empty (all padding bytes: one shared vector, like an unknown word)."""
        old = self.word_characters
        added = max(rows - old.shape[0], 0)
        new_words = list(new_words or [])
        if len(new_words) > added:
            raise ValueError(f"{len(new_words)} new words given for {added} new rows.")
        table, _ = self.spell(new_words, added, old.shape[1])
        self.word_characters = torch.cat([old[:rows], table.to(old.device)])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        characters = self.word_characters[input_ids].long().flatten(0, -2)  # (words, max_word_characters)
        embedded = self.character_embeddings(characters).transpose(1, 2)  # (words, channels, characters)
        features = torch.cat([F.relu(convolution(embedded).amax(-1)) for convolution in self.convolutions], dim=-1)
        for highway in self.highways:
            features = highway(features)
        return self.projection(features).view(*input_ids.shape, -1)


class TwoTowerClozeEmbeddings(nn.Module):
    """Token vectors shared by both towers (an embedding matrix, or the character CNN), scaled by sqrt(d) as
    fairseq does for both, plus fixed sinusoidal positions."""

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__()
        if config.input_representation == "char_cnn":
            self.word_embeddings = None
            self.character_cnn = TwoTowerClozeCharacterCNN(config)
        else:
            self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
            self.character_cnn = None
        self.scale = math.sqrt(config.hidden_size)
        self.register_buffer(
            "position_table", sinusoidal_positions(config.max_position_embeddings, config.hidden_size), persistent=False
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, inputs_embeds, attention_mask):
        if inputs_embeds is None:
            embed = self.character_cnn if self.character_cnn is not None else self.word_embeddings
            inputs_embeds = embed(input_ids)
        # Positions count real tokens, so left padding leaves the text's positions unchanged.
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return self.dropout(inputs_embeds * self.scale + self.position_table[positions].to(inputs_embeds.dtype))


class TwoTowerClozeAttention(nn.Module):
    """Multi-head attention whose keys and values start with one all-zero state (fairseq's `add_zero_attn`).

    Every query then has something to attend to: the first position of a tower, padded rows and fully masked
    combination queries give finite outputs instead of NaNs.
    """

    def __init__(self, config: TwoTowerClozeConfig, num_heads: int, query_size: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.hidden_size // num_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False  # the direction lives in the mask
        self.dropout = config.attention_probs_dropout_prob
        self.q_proj = nn.Linear(query_size or config.hidden_size, config.hidden_size)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, queries: torch.Tensor, keys_values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch, query_length, _ = queries.shape
        query = self.q_proj(queries).view(batch, query_length, self.num_heads, self.head_dim).transpose(1, 2)
        key = self.k_proj(keys_values).view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)
        value = self.v_proj(keys_values).view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)
        zero = key.new_zeros(batch, self.num_heads, 1, self.head_dim)
        key, value = torch.cat([zero, key], dim=2), torch.cat([zero, value], dim=2)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        output, _ = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
        )
        return self.out_proj(output.reshape(batch, query_length, -1))


class TwoTowerClozeFeedForward(nn.Module):
    """Pre-LN feed-forward sub-block with its residual: `x + W2 ReLU(W1 LN(x) + b1) + b2`."""

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.activation_dropout = nn.Dropout(config.activation_dropout)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        update = self.fc2(self.activation_dropout(F.relu(self.fc1(self.layer_norm(hidden)))))
        return hidden + self.dropout(update)


class TwoTowerClozeBlock(GradientCheckpointingLayer):
    """A tower block: pre-LN masked self-attention and FFN, each with a residual (Section 3.1)."""

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = TwoTowerClozeAttention(config, config.num_attention_heads)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.ffn = TwoTowerClozeFeedForward(config)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        normed = self.self_attn_layer_norm(hidden)
        hidden = hidden + self.dropout(self.self_attn(normed, normed, attention_mask))
        return self.ffn(hidden)


class TwoTowerClozeTower(nn.Module):
    """`num_hidden_layers` blocks and a final LayerNorm; the mask it is given sets its direction."""

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__()
        self.layers = nn.ModuleList(TwoTowerClozeBlock(config) for _ in range(config.num_hidden_layers))
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        states = [hidden]
        for layer in self.layers:
            hidden = layer(hidden, attention_mask)
            states.append(hidden)
        return self.final_layer_norm(hidden), states


class TwoTowerClozeCombination(nn.Module):
    """The combination layer (Section 3.2): attention over all 2T tower states, then a pre-LN FFN with residual.

    Query for token i: `F_{i-1} + B_{i+1}`, or their concatenation `[F_{i-1}; B_{i+1}]` that the attention's query
    projection maps from 2d to d (one projection, as fairseq's `concat_final_q`), zero past either end of the text.
    There is no residual around the attention: a residual would carry the query, i.e. the neighbours' states, past
    the mask. The FFN's output `f` is what the softmax (and the fine-tuning heads) read, with no LayerNorm after it
    (fairseq's `BidirectionalTransformerDecoderLayer` with `normalize_before`).
    """

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__()
        self.forward_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.backward_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.concat_query = config.query_combination == "concat"
        query_size = 2 * config.hidden_size if self.concat_query else config.hidden_size
        self.attention = TwoTowerClozeAttention(config, config.combination_attention_heads, query_size=query_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.ffn = TwoTowerClozeFeedForward(config)

    def forward(
        self, forward_states: torch.Tensor, backward_states: torch.Tensor, attention_mask: torch.Tensor, mode: str
    ) -> torch.Tensor:
        forward_states = self.forward_layer_norm(forward_states)
        backward_states = self.backward_layer_norm(backward_states)
        real = attention_mask[..., None].to(forward_states.dtype)
        previous_forward = F.pad((forward_states * real)[:, :-1], (0, 0, 1, 0))
        next_backward = F.pad((backward_states * real)[:, 1:], (0, 0, 0, 1))
        if self.concat_query:
            query = torch.cat([previous_forward, next_backward], dim=-1)
        else:
            query = previous_forward + next_backward
        keys_values = torch.cat([forward_states, backward_states], dim=1)
        mask = additive_mask(combination_visibility(attention_mask, mode), query.dtype)
        hidden = self.dropout(self.attention(query, keys_values, mask))
        return self.ffn(hidden)


@torch.no_grad()
def resize_adaptive_softmax(softmax: nn.AdaptiveLogSoftmaxWithLoss, num_classes: int, std: float) -> None:
    """Grow or shrink the last band of an adaptive softmax to `num_classes` in all; new rows start N(0, std)."""
    start = softmax.cutoffs[-2]
    if num_classes <= start:
        raise ValueError(
            f"The adaptive softmax's last band starts at word {start} (config.adaptive_softmax_cutoff); a vocabulary "
            f"of {num_classes} would leave it empty. Resize to more than {start} words."
        )
    old = softmax.tail[-1][1]
    new = nn.Linear(old.in_features, num_classes - start, bias=False, device=old.weight.device, dtype=old.weight.dtype)
    nn.init.normal_(new.weight, std=std)
    kept = min(old.out_features, new.out_features)
    new.weight[:kept] = old.weight[:kept]
    new.weight.requires_grad_(old.weight.requires_grad)
    softmax.tail[-1][1] = new
    softmax.n_classes = num_classes
    softmax.cutoffs[-1] = num_classes


class TwoTowerClozeZeroInitLinear(nn.Linear):
    """A Linear layer that `_init_weights` sets to zero (its own class, so the init holds on any load path)."""


class TwoTowerClozePreTrainedModel(PreTrainedModel):
    config_class = TwoTowerClozeConfig
    config: TwoTowerClozeConfig
    base_model_prefix = "cloze"
    # Arbitrary (non-causal, two-tower) masks: SDPA and eager only.
    _supports_sdpa = True
    supports_gradient_checkpointing = True
    _no_split_modules = ["TwoTowerClozeBlock", "TwoTowerClozeCombination"]

    def _flex_attn_can_dispatch(self, is_init_check: bool = False) -> bool:
        raise ValueError(
            "The two-tower cloze model does not support attn_implementation='flex_attention' (its keys start with a "
            "zero state under arbitrary two-tower masks); load it with 'sdpa' (the default) or 'eager'."
        )

    def resize_token_embeddings(
        self,
        new_num_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        mean_resizing: bool = True,
        new_words: list[str] | None = None,
    ):
        """transformers' `resize_token_embeddings`, for every input and output representation.

        Word embeddings: transformers' own resize (the tied flat softmax follows). Character CNN: the saved word ->
        bytes table gets rows for the new ids, spelled from `new_words` (the new tokens, in id order) where given and
        otherwise empty (all padding bytes, so the new ids share one vector until `set_word_vocabulary` respells
        them); the CNN's weights do not depend on the vocabulary. The adaptive softmax grows (or shrinks) its last
        band; it cannot shrink past the last `adaptive_softmax_cutoff`. Returns the input embeddings module (the
        character CNN for `char_cnn`; its `num_embeddings` is the new size).
        """
        base = getattr(self, self.base_model_prefix, self)
        cnn = base.embeddings.character_cnn
        if cnn is None:
            if new_words is not None:
                raise ValueError("new_words spells new rows of a char_cnn model; this model embeds word ids.")
            embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
            size = embeddings.num_embeddings
        else:
            size = new_num_tokens if new_num_tokens is not None else cnn.num_embeddings
            if pad_to_multiple_of is not None:
                if not isinstance(pad_to_multiple_of, int):
                    raise ValueError(
                        f"Asking to pad the embedding matrix to a multiple of `{pad_to_multiple_of}`, which is not and "
                        "integer. Please make sure to pass an integer"
                    )
                size = math.ceil(size / pad_to_multiple_of) * pad_to_multiple_of
            if size == cnn.num_embeddings and not new_words:
                return cnn
            cnn.resize(size, new_words)
            embeddings = cnn
            lm_head = getattr(self, "lm_head", None)
            if lm_head is not None:  # an untied flat softmax over a char_cnn vocabulary
                self.lm_head = self._get_resized_lm_head(lm_head, size, mean_resizing=mean_resizing)
        adaptive_softmax = getattr(self, "adaptive_softmax", None)
        if adaptive_softmax is not None and adaptive_softmax.n_classes != size:
            resize_adaptive_softmax(adaptive_softmax, size, self.config.initializer_range)
        self.config.vocab_size = size
        self.vocab_size = size
        return embeddings

    @torch.no_grad()
    def _init_weights(self, module):
        # N(0, initializer_range) for Linear/Embedding, LayerNorm (1, 0), biases 0.
        if isinstance(module, TwoTowerClozeZeroInitLinear):
            # Section 4: the classifier projection starts at zero, weights and bias.
            init.zeros_(module.weight)
            init.zeros_(module.bias)
            return
        super()._init_weights(module)
        if isinstance(module, TwoTowerClozeCharacterCNN):
            init.zeros_(module.word_characters)  # unspelled until set_word_vocabulary (or a checkpoint) fills it
        elif isinstance(module, TwoTowerClozeEmbeddings):
            init.copy_(module.position_table, sinusoidal_positions(*module.position_table.shape))
        elif isinstance(module, TwoTowerClozeHighwayGate):
            init.constant_(module.bias, 1.0)


@dataclass
class TowerStates:
    forward_states: torch.Tensor
    backward_states: torch.Tensor
    attention_mask: torch.Tensor  # (B, T) bool
    hidden_states: tuple[torch.Tensor, ...] | None


class TwoTowerClozeModel(TwoTowerClozePreTrainedModel):
    """The bare model: both towers and the combination layer; returns the combination outputs.

    The combination mask defaults to `config.finetune_combination_mask` (the fine-tuning view); pass
    `combination_mask="cloze"` for the pretraining view.
    """

    # A pretraining export also holds the output projection (saved when it is not tied to the input embeddings) or
    # the adaptive softmax, which the bare model does not read: loading it here is no mismatch. transformers adds
    # these patterns to every model that holds this one (the task heads); any other key that does not fit is still
    # reported.
    _keys_to_ignore_on_load_unexpected = [r"^lm_head\.", r"^adaptive_softmax\."]

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__(config)
        self.embeddings = TwoTowerClozeEmbeddings(config)
        self.forward_tower = TwoTowerClozeTower(config)
        self.backward_tower = TwoTowerClozeTower(config)
        self.combination = TwoTowerClozeCombination(config)
        self.post_init()

    def get_input_embeddings(self):
        if self.embeddings.character_cnn is not None:
            return self.embeddings.character_cnn
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        if self.embeddings.character_cnn is not None:
            raise ValueError("A char_cnn model has no embedding matrix: its words are spelled by the character CNN.")
        self.embeddings.word_embeddings = value

    def set_word_vocabulary(self, words: list[str]) -> int:
        """Char-CNN inputs: spell the vocabulary (`words[i]` is word id i) into the saved word -> bytes table.
        Returns how many words were cut to `max_word_characters`."""
        if self.embeddings.character_cnn is None:
            raise ValueError("set_word_vocabulary is for input_representation='char_cnn'; this model embeds word ids.")
        return self.embeddings.character_cnn.set_word_vocabulary(words)

    def run_towers(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
    ) -> TowerStates:
        """Embeddings and both towers: forward state i sees tokens <= i, backward state i sees tokens >= i."""
        if output_attentions or (output_attentions is None and self.config.output_attentions):
            raise ValueError(
                "The two-tower cloze model does not return attentions (each tower and the combination layer attend "
                "over a prepended zero state); drop output_attentions, or read them with a forward hook on "
                "TwoTowerClozeAttention under attn_implementation='eager'."
            )
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        if length > self.config.max_position_embeddings:
            raise ValueError(
                f"Input has {length} tokens but this model has {self.config.max_position_embeddings} positions; "
                "truncate the input (e.g. tokenizer(..., truncation=True, max_length=...))."
            )
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if attention_mask is None:
            attention_mask = torch.ones(batch, length, dtype=torch.bool, device=device)
        attention_mask = attention_mask.bool()
        hidden = self.embeddings(input_ids, inputs_embeds, attention_mask)

        position = torch.arange(length, device=device)
        keys = attention_mask[:, None, :]
        forward_mask = additive_mask((position[None, :] <= position[:, None])[None] & keys, hidden.dtype)
        backward_mask = additive_mask((position[None, :] >= position[:, None])[None] & keys, hidden.dtype)
        forward_states, forward_layers = self.forward_tower(hidden, forward_mask)
        backward_states, backward_layers = self.backward_tower(hidden, backward_mask)

        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        hidden_states = None
        if output_hidden_states:
            hidden_states = tuple(torch.cat(pair, dim=-1) for pair in zip(forward_layers, backward_layers))
        return TowerStates(forward_states, backward_states, attention_mask, hidden_states)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        combination_mask: str | None = None,
        output_tower_states: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> TwoTowerClozeModelOutput:
        r"""
        token_type_ids: accepted for tokenizer compatibility and unused: the paper marks pairs with a separator.
        combination_mask: "none", "curr" or "cloze" (default `config.finetune_combination_mask`).
        output_tower_states: also return each tower's final states.
        """
        towers = self.run_towers(input_ids, attention_mask, inputs_embeds, output_hidden_states, output_attentions)
        hidden = self.combination(
            towers.forward_states,
            towers.backward_states,
            towers.attention_mask,
            combination_mask or self.config.finetune_combination_mask,
        )
        return TwoTowerClozeModelOutput(
            last_hidden_state=hidden,
            forward_states=towers.forward_states if output_tower_states else None,
            backward_states=towers.backward_states if output_tower_states else None,
            hidden_states=towers.hidden_states,
        )


class TwoTowerCloze(TwoTowerClozePreTrainedModel):
    """Pretraining: the cloze loss, the bilm loss or both (`config.loss_type`), logits only at labelled tokens.

    The flat output projection is tied to the input embeddings (no bias); `config.use_adaptive_softmax` swaps it
    for an adaptive softmax (the paper's word models, whose character CNN has no matrix to tie to).
    """

    _tied_weights_keys = {"lm_head.weight": "cloze.embeddings.word_embeddings.weight"}
    # The pretraining loss is a fixed mean per objective; Trainer must not rescale it by its token count.
    accepts_loss_kwargs = False

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__(config)
        self.cloze = TwoTowerClozeModel(config)
        if config.use_adaptive_softmax:
            self.lm_head = None
            self.adaptive_softmax = nn.AdaptiveLogSoftmaxWithLoss(
                config.hidden_size,
                config.vocab_size,
                cutoffs=list(config.adaptive_softmax_cutoff),
                div_value=float(config.adaptive_softmax_div_value),
            )
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.adaptive_softmax = None
        if not (config.tie_word_embeddings and self.lm_head is not None):
            self._tied_weights_keys = {}  # nothing to tie
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def _predict(self, hidden: torch.Tensor, targets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (log-probabilities with the adaptive softmax) and the mean cross-entropy of `(N, d)` rows."""
        if self.adaptive_softmax is not None:
            if targets is None:
                return self.adaptive_softmax.log_prob(hidden), None
            # Training skips the full-vocabulary log-probabilities (the point of the banded softmax); eval returns them.
            logits = None if self.training else self.adaptive_softmax.log_prob(hidden)
            # No target in the batch: a zero loss that keeps the graph, not a NaN.
            loss = self.adaptive_softmax(hidden, targets).loss if targets.numel() else hidden.sum() * 0.0
            return logits, loss
        logits = self.lm_head(hidden)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float(), targets) if targets.numel() else logits.sum() * 0.0
        return logits, loss

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        prediction_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> TwoTowerClozeOutput:
        r"""
        labels: `(B, T)` target token ids, -100 where nothing is predicted (padding, boundary tokens); logits are then
            computed at the labelled positions only.
        prediction_mask: inference only, `(B, T)` bool: logits only at these positions (one row each, row-major).
            Without labels and without it, every position is predicted: `logits` `(B, T, vocab_size)` (the cloze
            prediction of each token from the words around it), and with a bilm objective `forward_logits` /
            `backward_logits` `(B, T, vocab_size)`, each tower's prediction of the next token in its direction (of
            token i + 1 from `F_i`, of token i - 1 from `B_i`).
        """
        if labels is not None and prediction_mask is not None:
            raise ValueError("prediction_mask chooses where to predict without labels; with labels, logits are "
                             "computed at the labelled positions.")
        loss_type = self.config.loss_type
        towers = self.cloze.run_towers(
            input_ids, attention_mask, inputs_embeds, output_hidden_states, output_attentions
        )
        # Collected here, built at the end: a ModelOutput orders its tuple by when each field was set.
        output = {"hidden_states": towers.hidden_states}
        cloze = loss_type in ("cloze", "cloze+bilm")
        bilm = loss_type in ("bilm", "cloze+bilm")
        if labels is None and prediction_mask is None:
            if cloze:
                hidden = self.cloze.combination(
                    towers.forward_states, towers.backward_states, towers.attention_mask, "cloze"
                )
                output["logits"] = self._predict_everywhere(hidden)
            if bilm:
                output["forward_logits"] = self._predict_everywhere(towers.forward_states)
                output["backward_logits"] = self._predict_everywhere(towers.backward_states)
            return TwoTowerClozeOutput(**output)

        targets_present = labels != -100 if labels is not None else prediction_mask.bool()
        rows, cols = targets_present.nonzero(as_tuple=True)
        targets = labels[rows, cols] if labels is not None else None

        if cloze:
            hidden = self.cloze.combination(
                towers.forward_states, towers.backward_states, towers.attention_mask, "cloze"
            )
            # Gather the target rows first: vocabulary logits only where there is something to predict.
            output["logits"], output["cloze_loss"] = self._predict(hidden[rows, cols], targets)

        if bilm:
            # Each tower alone predicts token i from its neighbour state (F_{i-1}, B_{i+1}) when that is real text.
            real, length = towers.attention_mask, towers.attention_mask.shape[1]
            has_left = (cols > 0) & real[rows, (cols - 1).clamp(min=0)]
            has_right = (cols < length - 1) & real[rows, (cols + 1).clamp(max=length - 1)]
            forward_hidden = towers.forward_states[rows[has_left], cols[has_left] - 1]
            backward_hidden = towers.backward_states[rows[has_right], cols[has_right] + 1]
            output["forward_logits"], forward_loss = self._predict(
                forward_hidden, targets[has_left] if targets is not None else None
            )
            output["backward_logits"], backward_loss = self._predict(
                backward_hidden, targets[has_right] if targets is not None else None
            )
            if targets is not None:
                output["bilm_loss"] = (forward_loss + backward_loss) / 2

        if labels is not None:
            if loss_type == "cloze":
                output["loss"] = output["cloze_loss"]
            elif loss_type == "bilm":
                output["loss"] = output["bilm_loss"]
            else:
                output["loss"] = output["cloze_loss"] + self.config.bilm_loss_weight * output["bilm_loss"]
        return TwoTowerClozeOutput(**output)

    def _predict_everywhere(self, hidden: torch.Tensor) -> torch.Tensor:
        """`(B, T, vocab_size)` logits (log-probabilities with the adaptive softmax) of `(B, T, d)` states."""
        batch, length, size = hidden.shape
        logits, _ = self._predict(hidden.reshape(batch * length, size), None)
        return logits.view(batch, length, -1)


class TwoTowerClozeForMaskedLM(TwoTowerCloze):
    """The pretrained cloze model as a masked LM (`pipeline("fill-mask")`): the same weights as `TwoTowerCloze`.

    Without labels, `logits` are `(B, T, vocab_size)`: the cloze prediction of every position from the words around
    it (the token itself, e.g. a mask token, is never seen). With labels it is `TwoTowerCloze`: the loss, and logits
    only at the labelled positions.
    """

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> MaskedLMOutput | TwoTowerClozeOutput:
        if labels is not None:
            return super().forward(
                input_ids, attention_mask, token_type_ids, inputs_embeds, labels, output_hidden_states,
                output_attentions, **kwargs,
            )
        towers = self.cloze.run_towers(
            input_ids, attention_mask, inputs_embeds, output_hidden_states, output_attentions
        )
        hidden = self.cloze.combination(towers.forward_states, towers.backward_states, towers.attention_mask, "cloze")
        return MaskedLMOutput(logits=self._predict_everywhere(hidden), hidden_states=towers.hidden_states)


def boundary_positions(
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    sep_token_id: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: the first real token (start boundary), the last real token (end boundary) and the pair separator
    (-1 when the row is a single sentence)."""
    length = attention_mask.shape[1]
    position = torch.arange(length, device=attention_mask.device).expand_as(attention_mask)
    first = attention_mask.int().argmax(dim=1)
    last = torch.where(attention_mask, position, -1).amax(dim=1)
    inside = attention_mask & (position > first[:, None]) & (position < last[:, None])
    if token_type_ids is not None and bool((token_type_ids * attention_mask).any()):
        # The separator is the last token of the first segment.
        candidates = inside & (token_type_ids == 0) & torch.roll(token_type_ids != 0, shifts=-1, dims=1)
    elif input_ids is not None and sep_token_id is not None:
        candidates = inside & (input_ids == sep_token_id)
    else:
        candidates = torch.zeros_like(inside)
    separator = torch.where(candidates, position, length).amin(dim=1)
    return first, last, torch.where(separator < length, separator, -1)


class TwoTowerClozeForSequenceClassification(TwoTowerClozePreTrainedModel):
    """Section 4: the combination outputs at the start and end boundaries (and the separator of a pair),
    concatenated, scaled by `classifier_scale`, dropout, then a zero-initialised projection. MSE when
    `num_labels == 1`.

    One `(3d -> C)` projection serves both cases: single sentences fill the separator slot with zeros, which is the
    paper's `W1` on `[f_first; f_last]`.
    """

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.cloze = TwoTowerClozeModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = TwoTowerClozeZeroInitLinear(3 * config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        outputs = self.cloze(
            input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, return_dict=True, **kwargs
        )
        hidden = outputs.last_hidden_state
        batch, length = hidden.shape[:2]
        if attention_mask is None:
            attention_mask = torch.ones(batch, length, dtype=torch.bool, device=hidden.device)
        first, last, separator = boundary_positions(
            input_ids, attention_mask.bool(), token_type_ids, self.config.sep_token_id
        )
        rows = torch.arange(batch, device=hidden.device)
        separator_state = hidden[rows, separator.clamp(min=0)] * (separator >= 0)[:, None].to(hidden.dtype)
        features = torch.cat([hidden[rows, first], hidden[rows, last], separator_state], dim=-1)
        logits = self.classifier(self.dropout(features * self.config.classifier_scale))
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class TwoTowerClozeForTokenClassification(TwoTowerClozePreTrainedModel):
    """A linear tagger on the combination outputs under the fine-tuning mask (which, by default, sees token i)."""

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.cloze = TwoTowerClozeModel(config)
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
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> TokenClassifierOutput:
        outputs = self.cloze(
            input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, return_dict=True, **kwargs
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config, **kwargs)
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class TwoTowerClozeForQuestionAnswering(TwoTowerClozePreTrainedModel):
    """Start and end classifiers on the combination outputs under the fine-tuning mask."""

    def __init__(self, config: TwoTowerClozeConfig):
        super().__init__(config)
        self.cloze = TwoTowerClozeModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        outputs = self.cloze(
            input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, return_dict=True, **kwargs
        )
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
        return QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, hidden_states=outputs.hidden_states
        )


__all__ = [
    "TwoTowerClozePreTrainedModel",
    "TwoTowerClozeModel",
    "TwoTowerCloze",
    "TwoTowerClozeForMaskedLM",
    "TwoTowerClozeForSequenceClassification",
    "TwoTowerClozeForTokenClassification",
    "TwoTowerClozeForQuestionAnswering",
    "TwoTowerClozeModelOutput",
    "TwoTowerClozeOutput",
]
