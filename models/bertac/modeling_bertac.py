"""BERTAC (Oh et al., 2021): a GAN-pretrained CNN fused into any transformer encoder through TIER layers.

Part 1, the CNN and its GAN pretraining (paper Section 3, Algorithm 1). `BertacCnnModel` is the CNN that BERTAC keeps
(the trained fake-entity generator F): frozen word embeddings -> bias-free `Linear(dw -> dw)` + leaky ReLU -> one
`Conv1d(width w, padding w - 1)` + leaky ReLU per window width -> average over time -> concatenation.
`BertacCnnForPreTraining` adds the real-entity generator R (same architecture, its own weights, the same frozen
table) and the logistic-regression discriminator D, and computes the GAN losses from logits.

Part 2, BERTAC itself (Section 4). `BertacModel` runs the encoder in full, then TIER layers on its last layer:

    m^1      = E[CNN words of each segment, the noun phrase replaced by [EM]]      (frozen fastText table)
    r^i      = F(m^i)                                                             (frozen CNN, one vector per segment)
    h^i      = TIER_i(h^{i-1}, r^i)                                               h^0: the encoder's last layer
    mbar_j   = softmax_j(m_j . (B r^i + b)) m_j                                   per segment, per layer
    m^{i+1}  = tanh(W_h mbar + b_h) * T + m * (1 - T),  T = sigmoid(W_t m + b_t)

TIER_i is a BERT layer whose attention takes its queries from the CNN vectors and its keys and values from the
token states: with p = softmax over tokens(q K^T / sqrt(d)) of shape (segments, tokens), token j's output is
`sum_q p[q, j] * v_j`, so the sequence keeps its length; then BERT's dense + dropout + residual LayerNorm and FFN.

The CNN reads words, not the encoder's pieces: `BertacWordLookup` rebuilds each segment's CNN word ids inside the
model from `input_ids` (tables saved with the weights), and `entity_spans` says which pieces form the masked noun
phrase (made outside the model, e.g. by `training/masking/entity_spans.py`). Inference needs neither spaCy nor fastText.

Deviations from the authors' released code, on purpose (each also in the README):
- The CNN's average pooling, the bilinear softmax and the TIER attention ignore padding (the released code lets
  padded words enter the mean and the softmax), so a prediction does not depend on how much padding a batch adds.
- The released code detaches the CNN vectors, so no gradient reaches the input-update layers and they stay at their
  random initialisation; the paper says they train. Here the gradient flows through the frozen CNN into them
  (`detach_cnn_output=True` restores the code's behaviour).
- Update layers exist between TIER layers only (the code also builds one after the last TIER, whose output is
  unused).
- Where the paper writes `B r` and `H = W_h mbar + b_h`, the code has a bias on B and `H = tanh(...)`: we follow the
  code.
- No noun phrase found: the paper uses the unmasked sentence (m = s); the code prepends [MASK]. We follow the paper.
"""

import math
import shutil
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AutoModel, BertConfig, PreTrainedModel
from transformers import initialization as init
from transformers.dynamic_module_utils import get_relative_import_files
from transformers.modeling_outputs import QuestionAnsweringModelOutput, SequenceClassifierOutput
from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput, BertPooler, BertSelfOutput
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple

from .bertac_backbone import BACKBONE_CLASSES
from .configuration_bertac import BertacCnnConfig, BertacConfig

GAN_STEPS = ("discriminator", "generator")


def discriminator_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    """D and R's loss, `-(log D(R(e)) + log(1 - D(F(m))))` averaged over the batch, from D's logits:
    `log D = logsigmoid(z)` and `log(1 - D) = -softplus(z)` stay finite where `log(1 - sigmoid(z))` gives -inf."""
    return (F.softplus(fake_logits.float()) - F.logsigmoid(real_logits.float())).mean()


def generator_loss(fake_logits: torch.Tensor, kind: str = "minimax") -> torch.Tensor:
    """F's loss: `log(1 - D(F(m))) = -softplus(z)` (minimax, Algorithm 1 line 9) or `-log D(F(m)) = -logsigmoid(z)`
    (non-saturating), averaged over the batch."""
    if kind == "minimax":
        return (-F.softplus(fake_logits.float())).mean()
    if kind == "non_saturating":
        return (-F.logsigmoid(fake_logits.float())).mean()
    raise ValueError(f"Unknown generator loss {kind!r}; choose minimax or non_saturating.")


def masked_mean(vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `(B, L, d)` vectors over the positions where `(B, L)` mask is 1."""
    mask = mask.to(vectors.dtype).unsqueeze(-1)
    return (vectors * mask).sum(1) / mask.sum(1).clamp(min=1.0)


@torch.no_grad()
def pair_statistics(predicted: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """Norms and the collapse signal of a batch of (prediction, target) rows, e.g. (F(m_i), R(e_i)).

    `cosine_related` is the mean cosine of each prediction with its own target, `cosine_unrelated` the mean over
    every i != j pair (computed in O(B d) from the sums of the unit vectors). A collapsed F gives every prediction
    the same direction: both cosines rise together and the gap between them closes.
    """
    predicted, target = predicted.detach().float(), target.detach().float()
    unit_predicted, unit_target = F.normalize(predicted, dim=-1), F.normalize(target, dim=-1)
    related = (unit_predicted * unit_target).sum(-1)
    n = predicted.shape[0]
    unrelated = None
    if n > 1:
        every_pair = unit_predicted.sum(0) @ unit_target.sum(0)
        unrelated = (every_pair - related.sum()) / (n * n - n)
    return {
        "fake_norm": predicted.norm(dim=-1).mean(),
        "real_norm": target.norm(dim=-1).mean(),
        "cosine_related": related.mean(),
        "cosine_unrelated": unrelated,
    }


@dataclass
class BertacCnnForPreTrainingOutput(ModelOutput):
    """
    loss: what the call trains: D and R's loss for `gan_step="discriminator"`, F's for `gan_step="generator"`, D's
        objective (`d_loss`) when `gan_step` is None (evaluation), the MSE with
        `pretraining_objective="self_supervised"`.
    d_loss: `-(log D(R(e)) + log(1 - D(F(m))))`, batch mean (2 ln 2 = 1.386 when D cannot tell real from fake).
    f_loss: F's loss (`log(1 - D(F(m)))` for the minimax game, so it is negative; `-log D(F(m))` non-saturating).
    mse_loss: the self-supervised ablation's loss, `|P F(m) - mean_e E(e)|^2` averaged over features and batch.
    d_accuracy_real / d_accuracy_fake: share of R(e) that D calls real (logit > 0) / of F(m) it calls fake (< 0).
    real_norm / fake_norm: mean L2 norm of R(e) (self-supervised: of the mean entity embedding) and of F(m)
        (self-supervised: of its projection).
    cosine_related / cosine_unrelated: the collapse signal, see `pair_statistics`.
    real_logits / fake_logits: `(B,)` D's logits on R(e) and F(m).
    real_representation / fake_representation: `(B, de)` R(e) and F(m).
    """

    loss: torch.Tensor | None = None
    d_loss: torch.Tensor | None = None
    f_loss: torch.Tensor | None = None
    mse_loss: torch.Tensor | None = None
    d_accuracy_real: torch.Tensor | None = None
    d_accuracy_fake: torch.Tensor | None = None
    real_norm: torch.Tensor | None = None
    fake_norm: torch.Tensor | None = None
    cosine_related: torch.Tensor | None = None
    cosine_unrelated: torch.Tensor | None = None
    real_logits: torch.Tensor | None = None
    fake_logits: torch.Tensor | None = None
    real_representation: torch.Tensor | None = None
    fake_representation: torch.Tensor | None = None


@dataclass
class BertacCnnModelOutput(ModelOutput):
    """
    pooler_output: `(B, len(filter_windows) * num_filters)` the CNN's vector of each word sequence. The CNN pools over
        time inside itself, so this vector is its only output: no per-word hidden states (`last_hidden_state`).
    """

    pooler_output: torch.Tensor | None = None


class BertacWordEmbeddings(nn.Module):
    """The frozen word embedding table, held as a persistent buffer: saved and loaded with the weights (transformers
    turns every loaded parameter trainable again, a buffer stays frozen), and never seen by an optimizer."""

    def __init__(self, config: BertacCnnConfig):
        super().__init__()
        self.padding_idx = config.pad_token_id
        self.register_buffer("weight", torch.zeros(config.vocab_size, config.word_embedding_dim), persistent=True)

    @property
    def num_embeddings(self) -> int:
        return self.weight.shape[0]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight, self.padding_idx)

    @torch.no_grad()
    def resize(self, rows: int, mean_resizing: bool = True) -> None:
        """Keep the first `rows` vectors; new rows get the mean of the old ones (`mean_resizing`, transformers'
        default) or U(-0.1, 0.1), the authors' vector for a word without a fastText vector."""
        old = self.weight
        new = old.new_empty(rows, old.shape[1]).uniform_(-0.1, 0.1)
        kept = min(rows, old.shape[0])
        new[:kept] = old[:kept]
        if mean_resizing and rows > kept:
            new[kept:] = old.mean(0)
        self.weight = new


class BertacWordProjection(nn.Linear):
    """W_s, the CNN's bias-free `dw -> dw` word projection (N(0, 0.1) init, as in the authors' `Generator`)."""

    def __init__(self, dim: int):
        super().__init__(dim, dim, bias=False)


class BertacDiscriminator(nn.Linear):
    """D: logistic regression on one CNN vector; returns its logit `w . z + b`, shape `(B,)`."""

    def __init__(self, in_features: int):
        super().__init__(in_features, 1)

    def forward(self, representation: torch.Tensor) -> torch.Tensor:
        return super().forward(representation).squeeze(-1)


class BertacCnnEncoder(nn.Module):
    """The trained part of one CNN (F or R): word projection, one convolution per window width, masked average
    pooling over time, concatenation. Reads word embeddings, so R and F can share one frozen table."""

    def __init__(self, config: BertacCnnConfig):
        super().__init__()
        self.windows = list(config.filter_windows)
        self.slope = config.leaky_relu_slope
        self.projection = BertacWordProjection(config.word_embedding_dim)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(config.word_embedding_dim, config.num_filters, width, padding=width - 1) for width in self.windows
        )

    def forward(self, word_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """`(B, L, dw)` embeddings and `(B, L)` mask (1 = word) -> `(B, len(windows) * num_filters)`."""
        mask = attention_mask.to(word_embeddings.dtype)
        # Zeroing the padded positions makes them exactly what Conv1d's own zero padding adds at the edges.
        words = F.leaky_relu(self.projection(word_embeddings), self.slope) * mask.unsqueeze(-1)
        words = words.transpose(1, 2)
        pooled = []
        for width, convolution in zip(self.windows, self.convolutions):
            features = F.leaky_relu(convolution(words), self.slope)  # (B, k, L + width - 1)
            # A window is real when it touches at least one word: these are the outputs of the unpadded sentence.
            touched = F.max_pool1d(F.pad(mask, (width - 1, width - 1)).unsqueeze(1), width, stride=1)
            pooled.append((features * touched).sum(-1) / touched.sum(-1).clamp(min=1.0))
        return torch.cat(pooled, dim=-1)


class BertacCnnPreTrainedModel(PreTrainedModel):
    config_class = BertacCnnConfig
    config: BertacCnnConfig
    base_model_prefix = "cnn"
    main_input_name = "input_ids"
    # The CNN has no attention: it computes the same under every implementation, so it accepts the one asked of
    # BERTAC (which applies it to the encoder), as transformers' attention-free sub-models accept their parent's.
    _supports_sdpa = True
    _supports_flash_attn = True

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        return True  # nothing to switch (the heuristic reads BertacTierAttention, of the same file)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> BertacWordEmbeddings:
        """Resizes the frozen word table (F and R read the same one): rows past the old table get the old rows'
        mean (`mean_resizing`) or U(-0.1, 0.1), as words without a fastText vector do; fill them from fastText
        through `get_input_embeddings().weight` for real vectors. The CNN's weights do not depend on the vocabulary."""
        table = self.get_input_embeddings()
        size = padded_size(new_num_tokens if new_num_tokens is not None else table.num_embeddings, pad_to_multiple_of)
        if size <= self.config.pad_token_id or (self.config.mask_token_id is not None
                                                and size <= self.config.mask_token_id):
            raise ValueError(f"A vocabulary of {size} words would drop [PAD] or [EM]; keep at least their ids.")
        table.resize(size, mean_resizing)
        self.config.vocab_size = size
        self.vocab_size = size
        return table

    @torch.no_grad()
    def _init_weights(self, module):
        # Called per module that holds parameters or buffers, so each role has its own class.
        config = self.config
        if isinstance(module, BertacWordProjection):
            init.normal_(module.weight, mean=0.0, std=config.projection_initializer_std)
        elif isinstance(module, nn.Conv1d):  # He init, as the paper says
            init.kaiming_normal_(module.weight, a=config.leaky_relu_slope, nonlinearity="leaky_relu")
            init.zeros_(module.bias)
        elif isinstance(module, BertacDiscriminator):
            # Logistic regression starts undecided (D = 1/2 everywhere), so its first update points from the fake
            # representations towards the real ones instead of along a random initial direction.
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):  # the self-supervised ablation's projection
            init.normal_(module.weight, mean=0.0, std=config.initializer_range)
            init.zeros_(module.bias)
        elif isinstance(module, BertacWordEmbeddings):
            table = module.weight
            if not getattr(table, "_is_hf_initialized", False):
                # Rows without a pretrained vector keep U(-0.1, 0.1) and the pad row is 0, as in the authors'
                # Generator; training/data/bertac_pairs.py fills the others from fastText.
                table.uniform_(-0.1, 0.1)
                table[config.pad_token_id].zero_()


def padded_size(size: int, pad_to_multiple_of) -> int:
    """`size` rounded up to a multiple of `pad_to_multiple_of` (transformers' rule and error)."""
    if pad_to_multiple_of is None:
        return size
    if not isinstance(pad_to_multiple_of, int):
        raise ValueError(
            f"Asking to pad the embedding matrix to a multiple of `{pad_to_multiple_of}`, which is not and integer. "
            "Please make sure to pass an integer"
        )
    return math.ceil(size / pad_to_multiple_of) * pad_to_multiple_of


class BertacCnnModel(BertacCnnPreTrainedModel):
    """BERTAC's CNN: a word sequence -> one `len(filter_windows) * num_filters` vector (`pooler_output`).

    The word embedding table is frozen (a buffer, not a parameter) and saved with the weights. Word ids come from the
    checkpoint's own word tokenizer (lowercased BERT basic words + `[EM]`):

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        model = AutoModel.from_pretrained(path, trust_remote_code=True)
        vector = model(**tokenizer(text, return_tensors="pt")).pooler_output

    BERTAC's TIER layers feed updated word embeddings instead of ids: pass them as `inputs_embeds`.
    """

    # An export of BertacCnnForPreTraining also holds R, D (or the self-supervised projection): not part of F.
    _keys_to_ignore_on_load_unexpected = [r"^real_encoder\.", r"^discriminator\.", r"^entity_projection\."]

    def __init__(self, config: BertacCnnConfig):
        super().__init__(config)
        self.embeddings = BertacWordEmbeddings(config)
        self.encoder = BertacCnnEncoder(config)
        self.post_init()

    def get_input_embeddings(self) -> BertacWordEmbeddings:
        return self.embeddings

    def set_input_embeddings(self, value: BertacWordEmbeddings):
        self.embeddings = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BertacCnnModelOutput:
        r"""
        input_ids: `(B, L)` CNN word ids. attention_mask: `(B, L)`, 1 on words (default: every non-pad id).
        inputs_embeds: `(B, L, dw)` word embeddings instead of ids (BERTAC's updated CNN inputs).
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if attention_mask is None:
            attention_mask = (
                input_ids != self.config.pad_token_id
                if input_ids is not None
                else inputs_embeds.new_ones(inputs_embeds.shape[:2])
            )
        if inputs_embeds is None:
            inputs_embeds = self.embeddings(input_ids)
        return BertacCnnModelOutput(pooler_output=self.encoder(inputs_embeds, attention_mask))


class BertacCnnForPreTraining(BertacCnnPreTrainedModel):
    """Algorithm 1's networks: F (`self.cnn`, the CNN BERTAC keeps; it holds the frozen word table), R
    (`self.real_encoder`, same architecture, separate weights, reads the same frozen table) and D
    (`self.discriminator`, logistic regression on one representation). D never sees which entity goes with which
    sentence: the game is unconditional, as in the paper.

    One call trains one side of the game, chosen by `gan_step` (the trainer makes two calls per batch, in the
    paper's order): "discriminator" gives D and R's loss with F(m) computed without gradient, "generator" gives F's
    loss through a detached copy of D. With `gan_step=None` it computes both without choosing (evaluation).
    With `pretraining_objective="self_supervised"` (the ablation of Tables 4 and 8) there is no R and no D: F(m)
    goes through `entity_projection`, a `Linear(de -> dw)`, and regresses the mean frozen word embedding of e.
    """

    # The losses are batch means; Trainer must not rescale them by a token count.
    accepts_loss_kwargs = False

    def __init__(self, config: BertacCnnConfig):
        super().__init__(config)
        self.cnn = BertacCnnModel(config)
        gan = config.pretraining_objective == "gan"
        self.real_encoder = BertacCnnEncoder(config) if gan else None
        self.discriminator = BertacDiscriminator(config.output_size) if gan else None
        self.entity_projection = None if gan else nn.Linear(config.output_size, config.word_embedding_dim)
        self.post_init()

    def get_input_embeddings(self) -> BertacWordEmbeddings:
        return self.cnn.get_input_embeddings()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        entity_ids: torch.Tensor | None = None,
        entity_attention_mask: torch.Tensor | None = None,
        gan_step: str | None = None,
        **kwargs,
    ) -> BertacCnnForPreTrainingOutput:
        r"""
        input_ids / attention_mask: `(B, L)` the entity-masked sentences m (word ids, `[EM]` in place of the mention).
        entity_ids / entity_attention_mask: `(B, Le)` the entity mentions e.
        gan_step: "discriminator" (Algorithm 1 line 8), "generator" (line 9) or None (both losses, nothing chosen).

        Without `entity_ids` (inference) only F runs: `fake_representation` F(m) and, in the GAN, D's `fake_logits` on
        it; no loss.
        """
        if gan_step is not None and gan_step not in GAN_STEPS:
            raise ValueError(f"gan_step={gan_step!r}; choose discriminator, generator or None.")
        pad = self.config.pad_token_id
        attention_mask = (input_ids != pad) if attention_mask is None else attention_mask
        if entity_ids is None:
            if gan_step is not None:
                raise ValueError(f"gan_step={gan_step!r} trains on pairs: pass entity_ids (the mentions e) too.")
            with torch.autocast(device_type=input_ids.device.type, enabled=False):
                fake = self.cnn(input_ids, attention_mask).pooler_output
                fake_logits = self.discriminator(fake) if self.discriminator is not None else None
            return BertacCnnForPreTrainingOutput(fake_logits=fake_logits, fake_representation=fake)
        entity_attention_mask = (entity_ids != pad) if entity_attention_mask is None else entity_attention_mask
        # The GAN stays in fp32 under bf16/fp16 autocast: its outputs are unnormalised and grow during training.
        with torch.autocast(device_type=input_ids.device.type, enabled=False):
            if self.config.pretraining_objective == "self_supervised":
                return self._self_supervised(input_ids, attention_mask, entity_ids, entity_attention_mask)
            return self._gan(input_ids, attention_mask, entity_ids, entity_attention_mask, gan_step)

    def _gan(self, input_ids, attention_mask, entity_ids, entity_attention_mask, gan_step):
        if gan_step == "generator":
            fake = self.cnn(input_ids, attention_mask).pooler_output
            # D is not trained by F's loss: the gradient reaches F only.
            fake_logits = F.linear(fake, self.discriminator.weight.detach(),
                                   self.discriminator.bias.detach()).squeeze(-1)
            f_loss = generator_loss(fake_logits, self.config.generator_loss)
            return BertacCnnForPreTrainingOutput(loss=f_loss, f_loss=f_loss, fake_logits=fake_logits,
                                                 fake_representation=fake)

        with torch.set_grad_enabled(torch.is_grad_enabled() and gan_step is None):  # F is not trained by D's loss
            fake = self.cnn(input_ids, attention_mask).pooler_output
        real = self.real_encoder(self.cnn.embeddings(entity_ids), entity_attention_mask)
        real_logits = self.discriminator(real)
        fake_logits = self.discriminator(fake)
        d_loss = discriminator_loss(real_logits, fake_logits)
        output = BertacCnnForPreTrainingOutput(
            loss=d_loss,
            d_loss=d_loss,
            d_accuracy_real=(real_logits.detach() > 0).float().mean(),
            d_accuracy_fake=(fake_logits.detach() < 0).float().mean(),
            real_logits=real_logits,
            fake_logits=fake_logits,
            real_representation=real,
            fake_representation=fake,
            **pair_statistics(fake, real),
        )
        if gan_step is None:
            output.f_loss = generator_loss(fake_logits, self.config.generator_loss)
        return output

    def _self_supervised(self, input_ids, attention_mask, entity_ids, entity_attention_mask):
        fake = self.cnn(input_ids, attention_mask).pooler_output
        predicted = self.entity_projection(fake)
        target = masked_mean(self.cnn.embeddings(entity_ids).float(), entity_attention_mask)
        mse_loss = F.mse_loss(predicted, target)
        return BertacCnnForPreTrainingOutput(
            loss=mse_loss, mse_loss=mse_loss, fake_representation=fake, **pair_statistics(predicted, target)
        )


# ======================================================================================== BERTAC (paper Section 4)
MAX_WORD_PIECES = 64  # an encoder word of more pieces maps to [UNK]
# Two polynomial hashes of a word's piece ids, combined into one 62-bit key: with 10^6 table entries the chance that
# any two collide is about 10^-7 (a build that meets one stops), that a looked-up word absent from the table matches
# an entry about 10^-13.
_HASH_MODULI = (2_147_483_647, 2_147_483_629)
_HASH_BASES = (1_000_003, 911_382_323)
_HASH_POWERS = torch.tensor([[pow(base, k, modulus) for k in range(MAX_WORD_PIECES)]
                             for base, modulus in zip(_HASH_BASES, _HASH_MODULI)], dtype=torch.long)
# Per encoder piece: a word begins at it / the next piece begins one / it is a bare word-start marker that belongs
# to no word (SentencePiece's "▁" before punctuation or a second space).
PIECE_STARTS_WORD, PIECE_ENDS_WORD, PIECE_SKIPPED = 1, 2, 4


def word_keys(piece_ids: torch.Tensor, piece_in_word: torch.Tensor, word_index: torch.Tensor, num_words: int):
    """The lookup key of each word from its pieces: `piece_ids`, the piece's position inside its word and the word's
    index (all `(N,)`). Returns `(num_words,)` keys and a mask of words longer than `MAX_WORD_PIECES` pieces."""
    powers = _HASH_POWERS.to(piece_ids.device)
    inside = piece_in_word < MAX_WORD_PIECES
    position = piece_in_word.clamp(max=MAX_WORD_PIECES - 1)
    hashes = []
    for row, modulus in enumerate(_HASH_MODULI):
        # (id + 1) < 2^21 and power < 2^31: a sum of at most 64 such products stays below 2^63.
        terms = torch.where(inside, (piece_ids + 1) * powers[row, position], 0)
        hashes.append(torch.zeros(num_words, dtype=torch.long, device=piece_ids.device)
                      .scatter_add_(0, word_index, terms) % modulus)
    too_long = (torch.zeros(num_words, dtype=torch.long, device=piece_ids.device)
                .scatter_add_(0, word_index, (~inside).long()) > 0)
    return hashes[0] * _HASH_MODULI[1] + hashes[1], too_long


def _is_punctuation(character: str) -> bool:
    """BERT's basic-tokeniser rule (the CNN's word rule): ASCII symbols and every Unicode P* character."""
    code = ord(character)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(character).startswith("P")


def _byte_level_decoder() -> dict[str, int]:
    """Byte-level BPE's (GPT-2's) printable stand-in character -> the byte it encodes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    characters, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, characters)}


def piece_flags(tokenizer) -> torch.Tensor:
    """Per piece id of a fast encoder tokenizer, where words begin and end under the CNN's word rule (which splits
    punctuation off): a word starts at a piece with a word-start marker (no WordPiece `##`; a SentencePiece `▁` or
    byte-level BPE space) or whose text starts with punctuation, and after a piece whose text ends with punctuation
    (or a BPE `</w>` suffix). A bare marker belongs to no word. Special tokens stand alone."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("BERTAC's word lookup needs the encoder's fast tokenizer (a tokenizer.json).")
    model = backend.model
    kind = type(model).__name__
    continuing = getattr(model, "continuing_subword_prefix", None) if kind == "WordPiece" else None
    suffix = getattr(model, "end_of_word_suffix", None) if kind == "BPE" else None
    byte_level = '"ByteLevel"' in backend.to_str()
    decoder = _byte_level_decoder() if byte_level else None
    specials = set(tokenizer.all_special_ids)
    vocabulary = tokenizer.get_vocab()
    flags = torch.zeros(max(len(tokenizer), max(vocabulary.values()) + 1), dtype=torch.uint8)
    for piece, index in vocabulary.items():
        if index in specials:
            flags[index] = PIECE_STARTS_WORD | PIECE_ENDS_WORD
            continue
        value = 0
        if continuing:
            marker, text = not piece.startswith(continuing), piece.removeprefix(continuing)
        elif byte_level:
            text = bytes(decoder.get(c, 0) for c in piece).decode("utf-8", errors="replace")
            marker, text = text.startswith(" "), text.lstrip(" ")
        else:
            marker, text = piece.startswith("\u2581"), piece.lstrip("\u2581")
        if suffix and text.endswith(suffix):
            value |= PIECE_ENDS_WORD
            text = text.removesuffix(suffix)
        if marker or (text and _is_punctuation(text[0])):
            value |= PIECE_STARTS_WORD
        if marker and not text:
            value |= PIECE_SKIPPED | PIECE_ENDS_WORD
        if text and _is_punctuation(text[-1]):
            value |= PIECE_ENDS_WORD
        flags[index] = value
    return flags


def _starts_after(before: int, flags: int) -> bool:
    """Does a piece begin a word, given its and the previous piece's flags (as `BertacWordLookup` decides)?"""
    return bool(flags & PIECE_STARTS_WORD or before & PIECE_ENDS_WORD)


def build_word_lookup(tokenizer, word_tokenizer, forms=("lower", "capitalized", "upper")) -> dict:
    """The tables `BertacWordLookup` reads, from the encoder's fast tokenizer and a `bertac_cnn` export's word
    tokenizer: per encoder piece its word-boundary flags, and for every CNN word the keys of the piece sequences the
    encoder gives it, sorted, with the CNN word id of each. Each word is encoded in its lowercase, Capitalised and
    UPPER forms (one form for an uncased encoder) and in each context that changes its pieces: at the start of a
    text, after a space (byte-level BPE marks it) and right after punctuation (SentencePiece then drops its `▁`). A
    form the encoder does not keep as one word, or tokenizes with its unknown token, is left out; a key two words
    share keeps the word of the more common form (lowercase first)."""
    flags = piece_flags(tokenizer)
    backend = type(tokenizer.backend_tokenizer).from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()  # a tokenizer.json may pad or truncate every encoding (sentence-transformers' do)
    backend.no_truncation()
    specials = set(word_tokenizer.all_special_tokens)
    vocabulary = sorted((word, index) for word, index in word_tokenizer.get_vocab().items() if word not in specials)
    casings = {"lower": str, "capitalized": str.capitalize, "upper": str.upper}

    def pieces_of(text):
        return backend.encode(text, add_special_tokens=False).ids

    if pieces_of("Word") == pieces_of("word"):  # an uncased encoder: one form says it all
        forms = [form for form in forms if form == "lower"]
    comma = pieces_of(",")
    contexts = {"": 0, " ": 0, ",": len(comma)}  # prefix -> its pieces, dropped from the form's
    reference = pieces_of("word")
    if pieces_of(" word") == reference:
        del contexts[" "]
    if pieces_of(",word")[: len(comma)] != comma or pieces_of(",word")[len(comma) :] == reference:
        del contexts[","]
    texts, drops, targets = [], [], []
    for form in forms:
        for word, index in vocabulary:
            for prefix, drop in contexts.items():
                texts.append(prefix + casings[form](word))
                drops.append(drop)
                targets.append(index)
    values = flags.tolist()
    encoded = [[i for i in encoding.ids[drop:] if not values[i] & PIECE_SKIPPED]
               for encoding, drop in zip(backend.encode_batch(texts, add_special_tokens=False), drops)]
    unknown = tokenizer.unk_token_id
    pieces, positions, owners, kept = [], [], [], []
    for ids, target in zip(encoded, targets):
        if not ids or len(ids) > MAX_WORD_PIECES or unknown in ids:
            continue
        if any(_starts_after(values[ids[t - 1]], values[ids[t]]) for t in range(1, len(ids))):
            continue  # the encoder splits this form into several words: no single key
        owners += [len(kept)] * len(ids)
        pieces += ids
        positions += range(len(ids))
        kept.append((tuple(ids), target))
    keys, _ = word_keys(torch.tensor(pieces, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                        torch.tensor(owners, dtype=torch.long), len(kept))
    seen: dict[int, tuple] = {}
    for key, (ids, target) in zip(keys.tolist(), kept):
        first = seen.setdefault(key, (ids, target))  # forms come in order of preference
        if first[0] != ids:
            raise ValueError(f"Two encoder words {first[0]} and {ids} share a lookup key; no table can be built.")
    ordered = sorted((key, target) for key, (_, target) in seen.items())
    separators = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id,
                  tokenizer.pad_token_id} - {None}
    return {
        "piece_flags": flags,
        "word_keys": torch.tensor([k for k, _ in ordered], dtype=torch.long),
        "word_ids": torch.tensor([v for _, v in ordered], dtype=torch.long),
        "separator_token_ids": sorted(separators),
        "cnn_unknown_word_id": word_tokenizer.unk_token_id,
    }


class BertacWordLookup(nn.Module):
    """Rebuilds each segment's CNN word ids from the encoder's `input_ids`.

    Segments are the runs of tokens between the encoder's special tokens (`[CLS] a [SEP] b [SEP]`, `<s> a </s></s> b
    </s>`). Inside a segment, a word starts at a piece with a word-start marker, at punctuation and after it (the CNN's
    word rule splits punctuation off; see `piece_flags`), and at the segment's first piece; a word's pieces give its
    key, and the table gives its CNN word id, or `[UNK]` when absent. `entity_spans` `(B, max_segments, 2)` gives,
    per segment, the first and one-past-last piece (counted from the segment's first piece) of the noun phrase the
    CNN sees as one `[EM]` word; -1 for none. The tables are buffers, saved with the weights.
    """

    def __init__(self, config: BertacConfig):
        super().__init__()
        self.max_segments = config.max_segments
        self.separators = list(config.separator_token_ids)
        self.unknown = config.cnn_unknown_word_id
        self.pad = config.cnn_config.pad_token_id
        self.entity = config.cnn_config.mask_token_id
        self.register_buffer("piece_flags", torch.zeros(config.backbone_vocab_size, dtype=torch.uint8))
        self.register_buffer("word_keys", torch.zeros(config.word_lookup_size, dtype=torch.long))
        self.register_buffer("word_ids", torch.zeros(config.word_lookup_size, dtype=torch.long))

    @torch.no_grad()
    def load_tables(self, tables: dict):
        for name in ("piece_flags", "word_keys", "word_ids"):
            getattr(self, name).copy_(tables[name])

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, entity_spans: torch.Tensor | None = None):
        """Returns CNN word ids `(B, max_segments, W)` and their mask (1 = word), W the most words of any segment."""
        batch, length = input_ids.shape
        device, segments = input_ids.device, self.max_segments
        positions = torch.arange(length, device=device).expand(batch, length)

        def shifted(values, fill=False):  # each piece's previous piece
            return F.pad(values[:, :-1], (1, 0), value=fill)

        in_segment = attention_mask.bool() & ~torch.isin(input_ids, torch.tensor(self.separators, device=device))
        first = in_segment & ~shifted(in_segment)
        segment = first.long().cumsum(1) - 1
        in_segment &= segment < segments  # tokens of a third segment have no CNN input
        segment = segment.clamp(0, segments - 1)
        segment_begin = torch.where(first & in_segment, positions, -1).cummax(1).values.clamp(min=0)
        offset = positions - segment_begin
        flags = self.piece_flags[input_ids.clamp(0, self.piece_flags.shape[0] - 1)].long()
        content = in_segment & ((flags & PIECE_SKIPPED) == 0)

        in_entity = torch.zeros_like(content)
        if entity_spans is not None:
            spans = entity_spans.to(device=device, dtype=torch.long).reshape(batch, -1, 2)[:, :segments]
            spans = F.pad(spans, (0, 0, 0, segments - spans.shape[1]), value=-1)
            bounds = spans.gather(1, segment.unsqueeze(-1).expand(batch, length, 2))
            in_entity = content & (bounds[..., 0] >= 0) & (offset >= bounds[..., 0]) & (offset < bounds[..., 1])

        def within_segment(values):  # running count of `values` inside each segment, this piece included
            total = values.long().cumsum(1)
            return total - total.gather(1, segment_begin) + values.gather(1, segment_begin).long()

        # The noun phrase is one word, begun by its first piece; outside it, words begin as `_starts_after` says,
        # after a piece outside any word, and right after the noun phrase.
        boundary = ((flags & PIECE_STARTS_WORD) > 0) | ((shifted(flags, 0) & PIECE_ENDS_WORD) > 0) | ~shifted(content)
        starts = ((content & ~in_entity & (boundary | shifted(in_entity)))
                  | (in_entity & (within_segment(in_entity) == 1)))
        word = within_segment(starts) - 1
        piece_in_word = positions - torch.where(starts, positions, -1).cummax(1).values
        # Every piece adds to its word's slot; pieces outside any word go to one extra slot, dropped after. (No
        # boolean indexing: fixed shapes, so the lookup traces into one graph under torch.compile.)
        slots = batch * segments * length
        slot = (torch.arange(batch, device=device)[:, None] * segments + segment) * length + word
        slot = torch.where(content, slot, slots).flatten()
        outside = torch.where(content, piece_in_word, MAX_WORD_PIECES).flatten()  # adds nothing to the extra slot's key
        keys, too_long = word_keys(input_ids.flatten(), outside, slot, slots + 1)
        keys, too_long = keys[:slots], too_long[:slots]
        exists = torch.zeros(slots + 1, dtype=torch.bool, device=device).index_fill_(0, slot, True)[:slots]
        entity_slot = torch.where(in_entity.flatten(), slot, slots)
        entity_word = torch.zeros(slots + 1, dtype=torch.bool, device=device).index_fill_(0, entity_slot, True)[:slots]

        words = torch.full((slots,), self.unknown, dtype=torch.long, device=device)
        if self.word_keys.numel():
            index = torch.searchsorted(self.word_keys, keys).clamp(max=self.word_keys.numel() - 1)
            found = (self.word_keys[index] == keys) & ~too_long
            words = torch.where(found, self.word_ids[index], words)
        words = torch.where(entity_word, self.entity, words)
        words = torch.where(exists, words, self.pad).view(batch, segments, length)
        mask = exists.view(batch, segments, length)
        if torch.compiler.is_compiling():
            # A fixed width (the sequence length) instead of the batch's most words: the extra columns are padding,
            # which the CNN, the input updates and the TIER attention all ignore, so the outputs are the same.
            return words, mask
        width = max(int(mask.sum(-1).max()), 1)
        return words[..., :width], mask[..., :width]


class BertacTierAttention(nn.Module):
    """TIER attention (Section 4.2): queries from the CNN vectors `(B, u, de)`, keys and values from the token states.
    With p = softmax over tokens of q K^T / sqrt(d), `(B, heads, u, L)`, token j's output is `sum_q p[q, j] v_j`
    (the paper's `(softmax(r K^T / sqrt(d)))^T J ⊙ V`), so the sequence keeps its length. A segment without words
    (the second of a single sentence) makes no query. (Transformers' attention functions compute `p V`, a `(u, d)`
    result, so the weights are computed here.)"""

    def __init__(self, config: BertConfig, cnn_dim: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(cnn_dim, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(self, hidden_states, cnn_vectors, token_mask, segment_mask):
        batch, length, width = hidden_states.shape
        query = self.query(cnn_vectors).view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)
        key = self.key(hidden_states).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        value = self.value(hidden_states).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        scores = (query @ key.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~token_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        probabilities = torch.softmax(scores.float(), dim=-1).to(value.dtype)
        probabilities = self.dropout(probabilities) * segment_mask[:, None, :, None].to(value.dtype)
        weights = probabilities.sum(2)  # (B, heads, L): sum over the queries
        context = (weights.unsqueeze(-1) * value).transpose(1, 2).reshape(batch, length, width)
        return context, probabilities


class BertacTierLayer(nn.Module):
    """A TIER layer: the TIER attention, then BERT's attention output (dense, dropout, residual LayerNorm) and FFN."""

    def __init__(self, config: BertConfig, cnn_dim: int):
        super().__init__()
        self.attention = BertacTierAttention(config, cnn_dim)
        self.attention_output = BertSelfOutput(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states, cnn_vectors, token_mask, segment_mask):
        context, probabilities = self.attention(hidden_states, cnn_vectors, token_mask, segment_mask)
        attended = self.attention_output(context, hidden_states)
        return self.output(self.intermediate(attended), attended), probabilities


class BertacBilinear(nn.Linear):
    """B (with the code's bias): `B r + b`, a CNN vector mapped into the word-embedding space."""


class BertacInputUpdate(nn.Module):
    """The update of one segment's CNN input between two TIER layers (Section 4.1), per layer and per segment, as in
    the code (separate parameters for the first and the second segment)."""

    def __init__(self, word_dim: int, cnn_dim: int):
        super().__init__()
        self.bilinear = BertacBilinear(cnn_dim, word_dim)
        self.transform = nn.Linear(word_dim, word_dim)  # W_h, b_h
        self.gate = nn.Linear(word_dim, word_dim)  # W_t, b_t

    def forward(self, words: torch.Tensor, vector: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """words `(N, W, dw)`, vector `(N, de)`, mask `(N, W)` -> updated words `(N, W, dw)` (zero on padding)."""
        scores = (words @ self.bilinear(vector).unsqueeze(-1)).squeeze(-1)
        # Softmax over the real words only (the code's softmax also covers padding).
        weights = torch.softmax(scores.float().masked_fill(~mask, torch.finfo(torch.float32).min),
                                dim=-1).to(words.dtype)
        highlighted = weights.unsqueeze(-1) * words
        gate = torch.sigmoid(self.gate(words))
        updated = torch.tanh(self.transform(highlighted)) * gate + words * (1 - gate)
        return updated * mask.unsqueeze(-1).to(words.dtype)


@dataclass
class BertacModelOutput(ModelOutput):
    """
    last_hidden_state: `(B, L, hidden)` the top TIER layer's states, projected back to the encoder's width (the
        encoder's last layer with `use_cnn_and_tier=False`).
    hidden_states: the encoder's hidden states (with `output_hidden_states`).
    attentions: the encoder's attention maps (with `output_attentions`).
    tier_hidden_states: each TIER layer's output `(B, L, tier width)` (with `output_hidden_states`).
    cnn_representations: r^i `(B, max_segments, de)`, the CNN vectors each TIER layer read.
    tier_attentions: each TIER layer's attention probabilities `(B, heads, max_segments, L)` (with
        `output_attentions`).
    """

    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    tier_hidden_states: tuple[torch.Tensor, ...] | None = None
    cnn_representations: tuple[torch.Tensor, ...] | None = None
    tier_attentions: tuple[torch.Tensor, ...] | None = None


def _portable_config(config) -> dict:
    """A config as a dict without the fields that name where it was loaded from."""
    values = config.to_dict()
    for key in ("_name_or_path", "name_or_path", "architectures", "transformers_version"):
        values.pop(key, None)
    return values


# Copied from models.hire.modeling_hire.backbone_positions
def backbone_positions(backbone: PreTrainedModel) -> int | None:
    """The longest input the encoder's absolute position table covers, or None when it has none (relative or rotary
    positions, whose limits the encoder checks itself). A RoBERTa-style table starts after its padding index."""
    table = getattr(getattr(backbone, "embeddings", None), "position_embeddings", None)
    if not isinstance(table, nn.Embedding):
        return None
    return table.num_embeddings - (table.padding_idx + 1 if table.padding_idx is not None else 0)


# Copied from models.hire.modeling_hire.check_input_length
def check_input_length(backbone: PreTrainedModel, inputs: torch.Tensor | None, position_ids: torch.Tensor | None):
    """The zoo encoders' error for `inputs` (ids or embeddings) longer than the encoder's positions, instead of the
    encoder's shape error deep inside its embeddings. (Explicit `position_ids` are the caller's to keep in range, as
    in the zoo encoders.)"""
    limit = backbone_positions(backbone)
    if inputs is not None and position_ids is None and limit is not None and inputs.shape[1] > limit:
        raise ValueError(
            f"Input has {inputs.shape[1]} tokens but this model has {limit} positions; "
            "truncate the input (e.g. tokenizer(..., truncation=True, max_length=...))."
        )


# Copied from models.hire.modeling_hire.build_backbone
def build_backbone(backbone_config) -> PreTrainedModel:
    """The encoder, from the classes saved with this checkpoint if any, else through `AutoModel`. Without its pooler
    where it has one: the pooler is never used, and unused parameters break DDP."""
    classes = BACKBONE_CLASSES.get(backbone_config.model_type)
    build = classes[1]._from_config if classes is not None else AutoModel.from_config
    try:
        return build(backbone_config, add_pooling_layer=False)
    except TypeError:
        return build(backbone_config)


BERTAC_FILES = ("configuration_bertac.py", "modeling_bertac.py", "bertac_backbone.py")


# Copied from models.hire.modeling_hire.backbone_code_files
def backbone_code_files(backbone: PreTrainedModel) -> dict[str, Path]:
    """The files of a remote-code encoder's classes (its config and model modules and what they import relatively),
    by name: what `save_backbone_code` copies. Empty for an encoder built into transformers."""
    config_class, model_class = type(backbone.config), type(backbone)
    if config_class.__module__.startswith("transformers.") and model_class.__module__.startswith("transformers."):
        return {}
    files = {}
    for cls in (config_class, model_class):
        source = Path(sys.modules[cls.__module__].__file__)
        for path in (source, *map(Path, get_relative_import_files(source))):
            files[path.name] = path
    return files


# Copied from models.hire.modeling_hire.save_backbone_code with HIRE->BERTAC,Hire->Bertac,hire->bertac
def save_backbone_code(backbone: PreTrainedModel, folder: Path) -> list[str]:
    """Copy a remote-code encoder's modeling files next to BERTAC's and write `bertac_backbone.py` to import its
    classes. Returns the copied file names (none for an encoder built into transformers)."""
    files = backbone_code_files(backbone)
    if not files:
        return []
    config_class, model_class = type(backbone.config), type(backbone)
    if clash := set(BERTAC_FILES) & set(files):
        raise ValueError(f"The encoder's code has files named like BERTAC's ({', '.join(sorted(clash))}); rename them.")
    for name, path in files.items():
        shutil.copyfile(path, folder / name)
    (folder / "bertac_backbone.py").write_text(
        '"""The encoder this BERTAC checkpoint runs on, whose code was saved next to BERTAC\'s (written by\n'
        'BertacPreTrainedModel.save_pretrained; transformers fetches these files with BERTAC\'s through the '
        'imports)."""\n\n'
        f"from .{config_class.__module__.rsplit('.', 1)[-1]} import {config_class.__name__}\n"
        f"from .{model_class.__module__.rsplit('.', 1)[-1]} import {model_class.__name__}\n\n"
        f"BACKBONE_CLASSES = {{{config_class.model_type!r}: ({config_class.__name__}, {model_class.__name__})}}\n"
    )
    return sorted(files)


class BertacPreTrainedModel(PreTrainedModel):
    config_class = BertacConfig
    config: BertacConfig
    base_model_prefix = "bertac"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        # transformers' heuristic finds BertacTierAttention, which computes its weights itself (one query per segment,
        # summed per token) under every implementation, and concludes that the setting cannot change. It can: it is
        # the encoder's, and set_attn_implementation checks the encoder's own class.
        return True

    def _flex_attn_can_dispatch(self, is_init_check: bool = False) -> bool:
        raise ValueError(
            "BERTAC does not support attn_implementation='flex_attention': it hands the setting to its encoder, which "
            "it runs under 'sdpa' (the default), 'eager' or flash attention only; load it with one of those."
        )

    @property
    def _bertac(self) -> "BertacModel":
        return self if isinstance(self, BertacModel) else self.bertac

    @torch.no_grad()
    def _init_weights(self, module):
        model = self._bertac
        owners = self.__dict__.setdefault("_part_of", {
            **{id(m): model.backbone for m in model.backbone.modules()},
            **({id(m): model.cnn for m in model.cnn.modules()} if model.cnn is not None else {}),
        })
        if id(module) in owners:
            owners[id(module)]._init_weights(module)  # the encoder's and the CNN's own init
        elif isinstance(module, BertacWordLookup):
            for table in (module.piece_flags, module.word_keys, module.word_ids):
                init.zeros_(table)  # filled by from_pretrained_parts or loaded
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Also saves the encoder's code when it is remote code (see `bertac_backbone.py`)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            save_backbone_code(self._bertac.backbone, Path(save_directory))

    def _freeze_cnn(self):
        """The CNN never trains unless `cnn_trainable` (transformers' loading makes every parameter trainable
        again, so this runs after `from_pretrained` too). Its word table is a buffer: frozen in every setting."""
        cnn = self._bertac.cnn
        if cnn is not None:
            cnn.requires_grad_(self.config.cnn_trainable)

    def resize_token_embeddings(self, *args, **kwargs):
        """Resizes the encoder's embeddings and keeps `backbone_config.vocab_size` in step, so the checkpoint reloads.
        New tokens get the word-boundary flags of the table's last row (the lookup clamps ids to its table)."""
        embeddings = self._bertac.backbone.resize_token_embeddings(*args, **kwargs)
        self.config.backbone_config.vocab_size = self.vocab_size = embeddings.num_embeddings
        return embeddings

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        loaded = super().from_pretrained(*args, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded)._freeze_cnn()
        return loaded

    @classmethod
    def from_pretrained_parts(
        cls,
        backbone: str,
        cnn: str | None = None,
        *,
        cnn_weights: Literal["pretrained", "random"] = "pretrained",
        trust_remote_code: bool = False,
        **options,
    ):
        """A new BERTAC over a pretrained encoder (`backbone`: any `AutoModel` path or Hub id) and a part-1 CNN export
        (`cnn`: a `bertac_cnn` folder, with its word tokenizer). `options` are `BertacConfig` fields (and
        `num_labels`). `cnn_weights="random"` keeps the export's frozen word table but starts the CNN from a fresh
        random init and trains it (Table 4's "randomly initialized CNN"); `use_cnn_and_tier=False` is the encoder
        alone with the same head (Table 8's "w/o CNN and TIER", no CNN needed)."""
        from transformers import AutoTokenizer

        if cnn_weights not in ("pretrained", "random"):
            raise ValueError(f"cnn_weights={cnn_weights!r}; choose pretrained or random.")
        encoder = AutoModel.from_pretrained(backbone, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(backbone, trust_remote_code=trust_remote_code)
        use_cnn = options.get("use_cnn_and_tier", True)
        values = dict(backbone_config=_portable_config(encoder.config), **options)
        word_cnn = tables = None
        if use_cnn:
            if cnn is None:
                raise ValueError("BERTAC needs a CNN: pass cnn=<a bertac_cnn export folder or Hub id>, or "
                                 "use_cnn_and_tier=False for the encoder alone.")
            model_type = BertacCnnConfig.get_config_dict(cnn)[0].get("model_type")
            if model_type != BertacCnnConfig.model_type:
                raise ValueError(f"{cnn} is a {model_type!r} checkpoint, not a bertac_cnn export "
                                 "(`training/pretrain.py --model bertac_cnn`).")
            word_cnn = BertacCnnModel.from_pretrained(cnn)
            word_tokenizer = AutoTokenizer.from_pretrained(cnn)
            if word_tokenizer.mask_token_id != word_cnn.config.mask_token_id:
                raise ValueError(f"{cnn} is not a bertac_cnn export: its tokenizer has no [EM] token matching the "
                                 "CNN's mask_token_id.")
            tables = build_word_lookup(tokenizer, word_tokenizer)
            values.update(
                cnn_config=_portable_config(word_cnn.config),
                cnn_trainable=cnn_weights == "random" or options.get("cnn_trainable", False),
                separator_token_ids=tables["separator_token_ids"],
                word_lookup_size=len(tables["word_keys"]),
                backbone_vocab_size=len(tables["piece_flags"]),
                cnn_unknown_word_id=tables["cnn_unknown_word_id"],
            )
        model = cls(BertacConfig(**values))
        base = model._bertac
        missing, _ = base.backbone.load_state_dict(encoder.state_dict(), strict=False)
        if missing:
            raise ValueError(f"The encoder weights from {backbone} lack {missing[:5]}.")
        if use_cnn:
            if cnn_weights == "pretrained":
                base.cnn.load_state_dict(word_cnn.state_dict())
            else:  # fresh CNN weights from the model's init, the export's frozen word table
                base.cnn.embeddings.weight.copy_(word_cnn.embeddings.weight)
            base.word_lookup.load_tables(tables)
        pooler = getattr(encoder, "pooler", None)
        dense = getattr(pooler, "dense", pooler)
        head = getattr(getattr(model, "pooler", None), "dense", None)
        if isinstance(dense, nn.Linear) and head is not None and dense.weight.shape == head.weight.shape:
            with torch.no_grad():  # the encoder's pretrained pooler, as the code reuses ALBERT's
                head.weight.copy_(dense.weight)
                head.bias.copy_(dense.bias)
        model._freeze_cnn()
        return model


class BertacModel(BertacPreTrainedModel):
    """The encoder, then the TIER layers with the CNN and its input updates (see the module docstring).

    Inputs are the encoder's (`input_ids`, `attention_mask`, `token_type_ids`) plus `entity_spans`: the masked noun
    phrase per segment, as `BertacWordLookup` reads it (`None`: no mask, the paper's m = s).
    """

    _keys_to_ignore_on_load_unexpected = [r"^pooler\.", r"^classifier\.", r"^qa_outputs\."]  # a head checkpoint's

    def __init__(self, config: BertacConfig):
        super().__init__(config)
        self.backbone = build_backbone(config.backbone_config)  # without its pooler: the heads have their own
        self.cnn = self.word_lookup = self.input_projection = self.output_projection = None
        self.tier_layers = self.input_updates = None
        if config.use_cnn_and_tier:
            tier = config.tier_layer_config()
            cnn_dim, word_dim = config.cnn_config.output_size, config.cnn_config.word_embedding_dim
            self.cnn = BertacCnnModel(config.cnn_config)
            self.word_lookup = BertacWordLookup(config)
            if tier.hidden_size != config.backbone_hidden_size:
                self.input_projection = nn.Linear(config.backbone_hidden_size, tier.hidden_size)
                self.output_projection = nn.Linear(tier.hidden_size, config.backbone_hidden_size)
            self.tier_layers = nn.ModuleList(BertacTierLayer(tier, cnn_dim) for _ in range(config.num_tier_layers))
            if config.update_cnn_input and config.num_tier_layers > 1:
                self.input_updates = nn.ModuleList(
                    nn.ModuleList(BertacInputUpdate(word_dim, cnn_dim) for _ in range(config.max_segments))
                    for _ in range(config.num_tier_layers - 1))
        self.post_init()
        self._freeze_cnn()

    def get_input_embeddings(self):
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.backbone.set_input_embeddings(value)

    def cnn_inputs(self, input_ids, attention_mask=None, entity_spans=None):
        """The CNN word ids `(B, max_segments, W)` and their mask the model builds from these inputs."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return self.word_lookup(input_ids, attention_mask, entity_spans)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        entity_spans: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> BertacModelOutput:
        r"""
        entity_spans: `(B, max_segments, 2)` per segment the first and one-past-last piece of the masked noun phrase,
            counted from the segment's first piece; -1 for none (see `training/masking/entity_spans.py`).
        """
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        reference = input_ids if input_ids is not None else inputs_embeds
        check_input_length(self.backbone, reference, position_ids)
        if attention_mask is None:
            attention_mask = torch.ones(reference.shape[:2], dtype=torch.long, device=reference.device)
        backbone_inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               inputs_embeds=inputs_embeds, output_hidden_states=output_hidden_states,
                               output_attentions=output_attentions, return_dict=True)
        if token_type_ids is not None:
            backbone_inputs["token_type_ids"] = token_type_ids
        encoded = self.backbone(**backbone_inputs)
        hidden = encoded.last_hidden_state
        # Some encoders return none (the two-tower cloze model).
        encoder_attentions = getattr(encoded, "attentions", None)
        if not self.config.use_cnn_and_tier:
            return BertacModelOutput(last_hidden_state=hidden, hidden_states=encoded.hidden_states,
                                     attentions=encoder_attentions)
        if input_ids is None:
            raise ValueError("BERTAC rebuilds its CNN words from input_ids; inputs_embeds alone cannot be mapped to "
                             "words.")

        words, word_mask = self.word_lookup(input_ids, attention_mask, entity_spans)
        batch, segments, width = words.shape
        segment_mask = word_mask.any(-1)
        flat_mask = word_mask.view(batch * segments, width)
        embeddings = self.cnn.get_input_embeddings()(words.view(batch * segments, width))  # m^1, frozen
        states = self.input_projection(hidden) if self.input_projection is not None else hidden
        token_mask = attention_mask.bool()
        vectors, tier_states, attentions = [], [], []
        for index, tier_layer in enumerate(self.tier_layers):
            vector = self.cnn.encoder(embeddings, flat_mask)  # r^i = F(m^i)
            if self.config.detach_cnn_output:
                vector = vector.detach()
            vector = vector.view(batch, segments, -1)
            states, probabilities = tier_layer(states, vector.to(states.dtype), token_mask, segment_mask)
            vectors.append(vector)
            tier_states.append(states)
            attentions.append(probabilities)
            if self.input_updates is not None and index < len(self.input_updates):
                embeddings = embeddings.view(batch, segments, width, -1)
                embeddings = torch.stack([update(embeddings[:, s], vector[:, s], word_mask[:, s])
                                          for s, update in enumerate(self.input_updates[index])], dim=1)
                embeddings = embeddings.view(batch * segments, width, -1)  # m^{i+1}
        output = self.output_projection(states) if self.output_projection is not None else states
        return BertacModelOutput(
            last_hidden_state=output,
            hidden_states=encoded.hidden_states,
            attentions=encoder_attentions,
            tier_hidden_states=tuple(tier_states) if output_hidden_states else None,
            cnn_representations=tuple(vectors),
            tier_attentions=tuple(attentions) if output_attentions else None,
        )


class BertacForSequenceClassification(BertacPreTrainedModel):
    """BERTAC with a sequence classifier on the first token of the top layer: dense + tanh (initialised from the
    encoder's pretrained pooler when it has one, as the code reuses ALBERT's), dropout, linear. Cross-entropy, or MSE
    for regression (`num_labels == 1`). The paper's passage selector is this class with 2 labels."""

    def __init__(self, config: BertacConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bertac = BertacModel(config)
        self.pooler = BertPooler(BertConfig(hidden_size=config.backbone_hidden_size))
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = nn.Linear(config.backbone_hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        entity_spans: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        outputs = self.bertac(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                              position_ids=position_ids, inputs_embeds=inputs_embeds, entity_spans=entity_spans,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              return_dict=True)
        logits = self.classifier(self.dropout(self.pooler(outputs.last_hidden_state)))
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                        attentions=outputs.attentions)


class BertacForQuestionAnswering(BertacPreTrainedModel):
    """BERTAC with start/end classifiers on every token of the top layer (the paper's answer span selector)."""

    def __init__(self, config: BertacConfig):
        super().__init__(config)
        self.bertac = BertacModel(config)
        self.qa_outputs = nn.Linear(config.backbone_hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        entity_spans: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        outputs = self.bertac(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                              position_ids=position_ids, inputs_embeds=inputs_embeds, entity_spans=entity_spans,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              return_dict=True)
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                            hidden_states=outputs.hidden_states, attentions=outputs.attentions)


__all__ = [
    "BertacPreTrainedModel",
    "BertacModel",
    "BertacForSequenceClassification",
    "BertacForQuestionAnswering",
    "BertacModelOutput",
    "BertacWordLookup",
    "BertacTierLayer",
    "BertacTierAttention",
    "BertacInputUpdate",
    "build_word_lookup",
    "word_keys",
    "BertacCnnPreTrainedModel",
    "BertacWordEmbeddings",
    "BertacWordProjection",
    "BertacDiscriminator",
    "BertacCnnEncoder",
    "BertacCnnModel",
    "BertacCnnForPreTraining",
    "BertacCnnForPreTrainingOutput",
    "BertacCnnModelOutput",
    "discriminator_loss",
    "generator_loss",
    "pair_statistics",
]
