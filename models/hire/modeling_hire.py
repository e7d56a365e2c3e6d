"""HIRE: a hidden representation extractor and a fusion network over a pretrained encoder.

Equations (numbers from the paper):
    u_i   = BiGRU_2layers(H_i)  final states of both layers and directions   (2)   i = 0..l, shared GRU
    a_i   = ReLU(w^T u_i + b)                                               (3)
    s     = softmax(a)                                                      (4)
    A     = sum_i s_i H_i                                                   (5)
    M     = [R; A; R + A; R * A]                                            (6)   R: last layer
    F     = BiGRU_2layers(M)                                                (7)
    q     = W2 tanh(W1 c + b1) + b2, c = F[first token]                     (8)
The GRUs never read padding (see `MaskedBiGRU`), so predictions do not depend on how much padding a batch has.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModel, PreTrainedModel
from transformers.modeling_outputs import ModelOutput
from transformers.utils.generic import can_return_tuple

from .configuration_hire import HireConfig


@dataclass
class HireModelOutput(ModelOutput):
    """
    last_hidden_state: F `(B, T, 2d)` (or M / A for the fusion ablations).
    layer_importance: s `(B, l + 1)`, the per-example importance of the embeddings and each encoder layer.
    """

    last_hidden_state: torch.Tensor | None = None
    layer_importance: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class HireSequenceClassifierOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    layer_importance: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


def reverse_within_length(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each right-padded sequence of `x` `(N, T, D)` inside its own length; padding stays in place."""
    positions = torch.arange(x.shape[1], device=x.device)
    index = torch.where(positions < lengths[:, None], lengths[:, None] - 1 - positions, positions)
    return x.gather(1, index[:, :, None].expand_as(x))


class MaskedBiGRU(nn.Module):
    """A stacked bidirectional GRU over right-padded sequences whose real positions never see the padding.

    The forward direction reads each sequence as it is, the backward direction reads it reversed within its length,
    so padding only ever comes after the real tokens. Same maths as `pack_padded_sequence`, without the packed
    path's per-step slicing, whose CPU backward is quadratic in the sequence length.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int):
        super().__init__()
        self.num_layers = num_layers
        self.forward_layers = nn.ModuleList(
            nn.GRU(input_size if i == 0 else 2 * hidden_size, hidden_size, batch_first=True) for i in range(num_layers))
        self.backward_layers = nn.ModuleList(
            nn.GRU(input_size if i == 0 else 2 * hidden_size, hidden_size, batch_first=True) for i in range(num_layers))

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns outputs `(N, T, 2h)` (garbage at padded positions) and final states `(layers * 2, N, h)` ordered
        like `nn.GRU`'s h_n: layer 0 forward, layer 0 backward, layer 1 forward, ..."""
        last = (lengths - 1).clamp(min=0)
        rows = torch.arange(inputs.shape[0], device=inputs.device)
        finals, x = [], inputs
        for forward_gru, backward_gru in zip(self.forward_layers, self.backward_layers):
            forward_out, _ = forward_gru(x)
            backward_out = reverse_within_length(backward_gru(reverse_within_length(x, lengths))[0], lengths)
            finals += [forward_out[rows, last], backward_out[:, 0]]
            x = torch.cat([forward_out, backward_out], dim=-1)
        return x, torch.stack(finals)


class HireScore(nn.Linear):
    """w^T u_i + b of equation (3)."""


class HireExtractor(nn.Module):
    """Scores the l + 1 hidden states with ONE shared 2-layer BiGRU (all layers in one batched call) and mixes them."""

    def __init__(self, config: HireConfig):
        super().__init__()
        self.config = config
        d = config.gru_dim
        self.summarizer = MaskedBiGRU(config.model_dim, d, num_layers=2)
        self.score = HireScore(4 * d, 1)
        # Fixed weightings of Table 5: log-weights over layers, -inf outside the selected ones.
        fixed = torch.zeros(config.num_layers)
        if config.layer_weighting == "random":
            fixed = torch.rand(config.num_layers, generator=torch.Generator().manual_seed(config.random_weighting_seed))
        selected = torch.zeros(config.num_layers, dtype=torch.bool)
        k = config.num_selected_layers
        if config.layer_selection == "all":
            selected[:] = True
        elif config.layer_selection == "first_k":
            selected[:k] = True
        else:
            selected[-k:] = True
        self.register_buffer("fixed_scores", fixed.masked_fill(~selected, float("-inf")), persistent=True)

    def forward(self, hidden_states: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden_states: `(L, B, T, d)` with L = l + 1. Returns A `(B, T, d)` and s `(B, L)`."""
        layers, batch, width, dim = hidden_states.shape
        if self.config.layer_weighting == "dynamic":
            _, final = self.summarizer(hidden_states.reshape(layers * batch, width, dim), lengths.repeat(layers))
            summary = final.permute(1, 0, 2).reshape(layers, batch, -1)  # u_i: both layers x both directions = 4d
            alpha = torch.relu(self.score(summary)).squeeze(-1).transpose(0, 1)  # (B, L)
        else:
            alpha = self.fixed_scores.to(hidden_states.dtype).expand(batch, layers)
        importance = torch.softmax(alpha.float(), dim=-1).to(hidden_states.dtype)
        mixed = torch.einsum("bl,lbtd->btd", importance, hidden_states)
        return mixed, importance


class HirePreTrainedModel(PreTrainedModel):
    config_class = HireConfig
    config: HireConfig
    base_model_prefix = "hire"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True

    @torch.no_grad()
    def _init_weights(self, module):
        backbone = self.backbone if isinstance(self, HireModel) else self.hire.backbone
        if id(module) in self.__dict__.setdefault("_backbone_module_ids", {id(m) for m in backbone.modules()}):
            backbone._init_weights(module)  # the encoder's own init, buffers included
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            # The score's bias starts at 1 so every layer's ReLU(w^T u + b) starts in its linear region: at 0, all
            # scores can start clipped, leaving s uniform and untrainable (the paper gives no initialisation).
            nn.init.constant_(module.bias, 1.0 if isinstance(module, HireScore) else 0.0)
        # GRUs keep PyTorch's initialisation.


class HireModel(HirePreTrainedModel):
    """Encoder + HIRE + fusion network: returns F and the layer importance scores."""

    def __init__(self, config: HireConfig):
        super().__init__(config)
        try:  # the pooler is never used; leaving it out keeps DDP free of unused parameters
            self.backbone = AutoModel.from_config(config.backbone_config, add_pooling_layer=False)
        except TypeError:
            self.backbone = AutoModel.from_config(config.backbone_config)
        self.extractor = HireExtractor(config) if config.use_hire else None
        self.fusion = None
        if config.use_fusion and config.fusion_layers > 0:
            self.fusion = MaskedBiGRU(4 * config.model_dim, config.gru_dim, num_layers=config.fusion_layers)
        self.post_init()

    @property
    def output_dim(self) -> int:
        if not self.config.use_fusion:
            return self.config.model_dim
        return 2 * self.config.gru_dim if self.fusion is not None else 4 * self.config.model_dim

    def get_input_embeddings(self):
        return self.backbone.get_input_embeddings()

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                output_hidden_states=None, **kwargs) -> HireModelOutput:
        reference = input_ids if input_ids is not None else inputs_embeds
        if attention_mask is None:
            attention_mask = torch.ones(reference.shape[:2], dtype=torch.long, device=reference.device)
        backbone_inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               inputs_embeds=inputs_embeds, output_hidden_states=True, return_dict=True)
        if token_type_ids is not None:
            backbone_inputs["token_type_ids"] = token_type_ids
        encoded = self.backbone(**backbone_inputs)
        lengths = attention_mask.sum(-1)
        if lengths.min() == 0:
            raise ValueError("An input has no token; every sequence needs at least one unpadded token.")
        # The recurrent layers stop at the longest real sequence: columns of padding only are pure cost for a GRU.
        width = int(lengths.max())
        hidden_states = tuple(h[:, :width] for h in encoded.hidden_states)  # H_0 (embeddings) .. H_l
        last = hidden_states[-1]  # R, the preliminary representation
        importance = None
        if self.extractor is not None:
            complementary, importance = self.extractor(torch.stack(hidden_states), lengths)
        else:
            complementary = last
        if not self.config.use_fusion:
            output = complementary
        else:
            fused = torch.cat([last, complementary, last + complementary, last * complementary], dim=-1)
            output = self.fusion(fused, lengths)[0] if self.fusion is not None else fused
        if width < attention_mask.shape[1]:  # give back the caller's sequence length (zeros past the longest input)
            output = nn.functional.pad(output, (0, 0, 0, attention_mask.shape[1] - width))
        return HireModelOutput(last_hidden_state=output, layer_importance=importance,
                               hidden_states=encoded.hidden_states if output_hidden_states else None)


class HireRobertaForSequenceClassification(HirePreTrainedModel):
    """HIRE + fusion over a pretrained encoder with the paper's output layer `W2 tanh(W1 c + b1) + b2`.
    Cross-entropy for classification, MSE for regression (`num_labels == 1`)."""

    def __init__(self, config: HireConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.hire = HireModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.dense = nn.Linear(self.hire.output_dim, config.model_dim)  # W1: 2d -> d
        self.out_proj = nn.Linear(config.model_dim, config.num_labels)  # W2: d -> m
        self.post_init()

    @classmethod
    def from_backbone_pretrained(cls, path_or_id: str, num_labels: int = 2, **hire_options):
        """A new HIRE classifier over pretrained encoder weights (e.g. `roberta-large`, or a local MiniLM)."""
        backbone = AutoModel.from_pretrained(path_or_id)
        config = HireConfig(backbone_config=backbone.config.to_dict(), num_labels=num_labels, **hire_options)
        model = cls(config)
        missing, unexpected = model.hire.backbone.load_state_dict(backbone.state_dict(), strict=False)
        if missing:
            raise ValueError(f"Backbone weights from {path_or_id} lack {missing[:5]}.")
        model.config.name_or_path = path_or_id
        return model

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_hidden_states=None, **kwargs) -> HireSequenceClassifierOutput:
        outputs = self.hire(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            position_ids=position_ids, inputs_embeds=inputs_embeds,
                            output_hidden_states=output_hidden_states, return_dict=True)
        first = self.dropout(outputs.last_hidden_state[:, 0])
        logits = self.out_proj(torch.tanh(self.dense(first)))
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return HireSequenceClassifierOutput(loss=loss, logits=logits, layer_importance=outputs.layer_importance,
                                            hidden_states=outputs.hidden_states)


__all__ = ["HirePreTrainedModel", "HireModel", "HireRobertaForSequenceClassification", "HireExtractor", "HireModelOutput", "MaskedBiGRU"]
