"""BERTAC's CNN and its GAN pretraining (paper Section 3, Algorithm 1).

`BertacCnnModel` is the CNN that BERTAC keeps (the trained fake-entity generator F): frozen word embeddings ->
bias-free `Linear(dw -> dw)` + leaky ReLU -> one `Conv1d(width w, padding w - 1)` + leaky ReLU per window width ->
average over time -> concatenation. `BertacCnnForPreTraining` adds the real-entity generator R (same architecture,
its own weights, the same frozen table) and the logistic-regression discriminator D, and computes the GAN losses
from logits.

Deviation from the authors' released `Generator`, on purpose: the average pooling counts only the convolution
windows that touch a real word, so a sentence gets the same vector however much padding its batch adds (the released
code averages over the padded length, so pads add `leaky_relu(bias)` terms).
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import ModelOutput

from .configuration_bertac import BertacCnnConfig

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
        objective (`d_loss`) when `gan_step` is None (evaluation), the MSE with `pretraining_objective="self_supervised"`.
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


class BertacWordEmbeddings(nn.Module):
    """The frozen word embedding table, held as a persistent buffer: saved and loaded with the weights (transformers
    turns every loaded parameter trainable again, a buffer stays frozen), and never seen by an optimizer."""

    def __init__(self, config: BertacCnnConfig):
        super().__init__()
        self.padding_idx = config.pad_token_id
        self.register_buffer("weight", torch.zeros(config.vocab_size, config.word_embedding_dim), persistent=True)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight, self.padding_idx)


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
                # Generator; training/bertac_data.py fills the others from fastText.
                table.uniform_(-0.1, 0.1)
                table[config.pad_token_id].zero_()


class BertacCnnModel(BertacCnnPreTrainedModel):
    """BERTAC's CNN: a word sequence -> one `len(filter_windows) * num_filters` vector (`pooler_output`).

    The word embedding table is frozen (a buffer, not a parameter) and saved with the weights. Word ids come from the
    checkpoint's own word tokenizer (lowercased BERT basic words + `[EM]`):

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        vector = AutoModel.from_pretrained(path, trust_remote_code=True)(**tokenizer(text, return_tensors="pt")).pooler_output

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

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPooling:
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
        return BaseModelOutputWithPooling(pooler_output=self.encoder(inputs_embeds, attention_mask))


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
        """
        if entity_ids is None:
            raise ValueError("BertacCnnForPreTraining needs entity_ids (the mentions e) next to input_ids (the masked sentences m).")
        if gan_step is not None and gan_step not in GAN_STEPS:
            raise ValueError(f"gan_step={gan_step!r}; choose discriminator, generator or None.")
        pad = self.config.pad_token_id
        attention_mask = (input_ids != pad) if attention_mask is None else attention_mask
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
            fake_logits = F.linear(fake, self.discriminator.weight.detach(), self.discriminator.bias.detach()).squeeze(-1)
            f_loss = generator_loss(fake_logits, self.config.generator_loss)
            return BertacCnnForPreTrainingOutput(loss=f_loss, f_loss=f_loss, fake_logits=fake_logits, fake_representation=fake)

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


__all__ = [
    "BertacCnnPreTrainedModel",
    "BertacWordEmbeddings",
    "BertacWordProjection",
    "BertacDiscriminator",
    "BertacCnnEncoder",
    "BertacCnnModel",
    "BertacCnnForPreTraining",
    "BertacCnnForPreTrainingOutput",
    "discriminator_loss",
    "generator_loss",
    "pair_statistics",
]
