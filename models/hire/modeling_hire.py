"""HIRE: a hidden representation extractor and a fusion network over a pretrained encoder (Yang and Zhao, 2019,
"Deepening Hidden Representations from Pre-trained Language Models").

Equations (numbers from the paper):
    u_i   = BiGRU_2layers(H_i)  final states of both layers and directions   (2)   i = 0..l, shared GRU
    a_i   = ReLU(w^T u_i + b)                                               (3)
    s     = softmax(a)                                                      (4)
    A     = sum_i s_i H_i                                                   (5)
    M     = [R; A; R + A; R * A]                                            (6)   R: last layer
    F     = BiGRU_2layers(M)                                                (7)
    q     = W2 tanh(W1 c + b1) + b2, c = F[first token]                     (8)
The GRUs never read padding (see `MaskedBiGRU`), and every batch runs right-padded inside the model (see
`right_aligned_order`), so predictions depend neither on how much padding a batch has nor on which side it is.
"""

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, PreTrainedModel
from transformers import initialization as init
from transformers.dynamic_module_utils import get_relative_import_files
from transformers.modeling_outputs import ModelOutput
from transformers.utils.generic import can_return_tuple

from .configuration_hire import HireConfig
from .hire_backbone import BACKBONE_CLASSES


@dataclass
class HireModelOutput(ModelOutput):
    """
    last_hidden_state: F `(B, T, 2d)` (or M / A for the fusion ablations), in the caller's padding layout.
    layer_importance: s `(B, l + 1)`, the per-example importance of the embeddings and each encoder layer.
    hidden_states / attentions: the encoder's (with `output_hidden_states` / `output_attentions`), in the caller's
        padding layout.
    """

    last_hidden_state: torch.Tensor | None = None
    layer_importance: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class HireSequenceClassifierOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    layer_importance: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def right_aligned_order(attention_mask: torch.Tensor) -> torch.Tensor:
    """Per row, the positions of its real tokens in order, then those of its padding: gathering with it turns any
    padding layout (left, right) into right padding. The identity for right-padded rows."""
    return torch.sort((attention_mask == 0).int(), dim=1, stable=True).indices


def gather_positions(x: torch.Tensor | None, order: torch.Tensor) -> torch.Tensor | None:
    """`x[b, order[b, t]]` for `(B, T)` or `(B, T, D)` tensors."""
    if x is None:
        return None
    return x.gather(1, order if x.dim() == 2 else order[..., None].expand_as(x))


def gather_attention(attention: torch.Tensor | None, order: torch.Tensor) -> torch.Tensor | None:
    """An attention map `(B, heads, T, T)` with its queries and keys both reordered by `order`."""
    if attention is None:
        return None
    attention = attention.gather(2, order[:, None, :, None].expand_as(attention))
    return attention.gather(3, order[:, None, None, :].expand_as(attention))


def reverse_within_length(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each right-padded sequence of `x` `(N, T, D)` inside its own length; padding stays in place."""
    positions = torch.arange(x.shape[1], device=x.device)
    index = torch.where(positions < lengths[:, None], lengths[:, None] - 1 - positions, positions)
    return x.gather(1, index[:, :, None].expand_as(x))


class MaskedBiGRU(nn.Module):
    """A stacked bidirectional GRU over right-padded sequences whose real positions never see the padding.

    The forward direction reads each sequence as it is, the backward direction reads it reversed within its length,
    so padding only ever comes after the real tokens. Same maths as `pack_padded_sequence` through
    `nn.GRU(bidirectional=True, dropout=dropout)` (dropout on every layer's output but the last), without the packed
    path's per-step slicing, whose CPU backward is quadratic in the sequence length.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, dropout: float = 0.0):
        super().__init__()
        self.num_layers = num_layers
        self.forward_layers = nn.ModuleList(
            nn.GRU(input_size if i == 0 else 2 * hidden_size, hidden_size, batch_first=True) for i in range(num_layers))
        self.backward_layers = nn.ModuleList(
            nn.GRU(input_size if i == 0 else 2 * hidden_size, hidden_size, batch_first=True) for i in range(num_layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns outputs `(N, T, 2h)` (garbage at padded positions) and final states `(layers * 2, N, h)` ordered
        like `nn.GRU`'s h_n: layer 0 forward, layer 0 backward, layer 1 forward, ..."""
        last = (lengths - 1).clamp(min=0)
        rows = torch.arange(inputs.shape[0], device=inputs.device)
        finals, x = [], inputs
        for layer, (forward_gru, backward_gru) in enumerate(zip(self.forward_layers, self.backward_layers)):
            if layer > 0:
                x = self.dropout(x)
            forward_out, _ = forward_gru(x)
            backward_out = reverse_within_length(backward_gru(reverse_within_length(x, lengths))[0], lengths)
            finals += [forward_out[rows, last], backward_out[:, 0]]
            x = torch.cat([forward_out, backward_out], dim=-1)
        return x, torch.stack(finals)


class HireImportanceScorer(nn.Linear):
    """w^T u_i + b of equation (3). (Not named `score`: PEFT takes modules named `score` or `classifier` for the
    classification head.)"""


def fixed_layer_scores(config: HireConfig) -> torch.Tensor:
    """The fixed weightings of Table 5: log-weights over the l + 1 layers, -inf outside the selected ones."""
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
    return fixed.masked_fill(~selected, float("-inf"))


class HireExtractor(nn.Module):
    """Scores the l + 1 hidden states with ONE shared 2-layer BiGRU (all layers in one batched call) and mixes them.

    The fixed weightings of Table 5 have no summariser and no scorer: only the fixed scores.
    """

    def __init__(self, config: HireConfig):
        super().__init__()
        self.config = config
        d = config.gru_dim
        self.summarizer = self.importance = None
        if config.layer_weighting == "dynamic":
            self.summarizer = MaskedBiGRU(config.model_dim, d, num_layers=2, dropout=config.gru_dropout)
            self.importance = HireImportanceScorer(4 * d, 1)
        self.register_buffer("fixed_scores", fixed_layer_scores(config), persistent=True)

    def forward(self, hidden_states: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden_states: `(L, B, T, d)` with L = l + 1, right-padded. Returns A `(B, T, d)` and s `(B, L)`."""
        layers, batch, width, dim = hidden_states.shape
        if self.summarizer is not None:
            _, final = self.summarizer(hidden_states.reshape(layers * batch, width, dim), lengths.repeat(layers))
            summary = final.permute(1, 0, 2).reshape(layers, batch, -1)  # u_i: both layers x both directions = 4d
            alpha = torch.relu(self.importance(summary)).squeeze(-1).transpose(0, 1)  # (B, L)
        else:
            alpha = self.fixed_scores.to(hidden_states.dtype).expand(batch, layers)
        importance = torch.softmax(alpha.float(), dim=-1).to(hidden_states.dtype)
        mixed = torch.einsum("bl,lbtd->btd", importance, hidden_states)
        return mixed, importance


class HireClassificationHead(nn.Module):
    """The output layer of equation (8), `W2 tanh(W1 c + b1) + b2`, on the first token's representation c."""

    def __init__(self, config: HireConfig, input_size: int):
        super().__init__()
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.dense = nn.Linear(input_size, config.model_dim)  # W1: 2d -> d
        self.out_proj = nn.Linear(config.model_dim, config.num_labels)  # W2: d -> m

    def forward(self, first_token: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(self.dropout(first_token))))


def backbone_positions(backbone: PreTrainedModel) -> int | None:
    """The longest input the encoder's absolute position table covers, or None when it has none (relative or rotary
    positions, whose limits the encoder checks itself). A RoBERTa-style table starts after its padding index."""
    table = getattr(getattr(backbone, "embeddings", None), "position_embeddings", None)
    if not isinstance(table, nn.Embedding):
        return None
    return table.num_embeddings - (table.padding_idx + 1 if table.padding_idx is not None else 0)


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


def build_backbone(backbone_config) -> PreTrainedModel:
    """The encoder, from the classes saved with this checkpoint if any, else through `AutoModel`. Without its pooler
    where it has one: the pooler is never used, and unused parameters break DDP."""
    classes = BACKBONE_CLASSES.get(backbone_config.model_type)
    build = classes[1]._from_config if classes is not None else AutoModel.from_config
    try:
        return build(backbone_config, add_pooling_layer=False)
    except TypeError:
        return build(backbone_config)


HIRE_FILES = ("configuration_hire.py", "modeling_hire.py", "hire_backbone.py")


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


def save_backbone_code(backbone: PreTrainedModel, folder: Path) -> list[str]:
    """Copy a remote-code encoder's modeling files next to HIRE's and write `hire_backbone.py` to import its
    classes. Returns the copied file names (none for an encoder built into transformers)."""
    files = backbone_code_files(backbone)
    if not files:
        return []
    config_class, model_class = type(backbone.config), type(backbone)
    if clash := set(HIRE_FILES) & set(files):
        raise ValueError(f"The encoder's code has files named like HIRE's ({', '.join(sorted(clash))}); rename them.")
    for name, path in files.items():
        shutil.copyfile(path, folder / name)
    (folder / "hire_backbone.py").write_text(
        '"""The encoder this HIRE checkpoint runs on, whose code was saved next to HIRE\'s (written by\n'
        'HirePreTrainedModel.save_pretrained; transformers fetches these files with HIRE\'s through the '
        'imports)."""\n\n'
        f"from .{config_class.__module__.rsplit('.', 1)[-1]} import {config_class.__name__}\n"
        f"from .{model_class.__module__.rsplit('.', 1)[-1]} import {model_class.__name__}\n\n"
        f"BACKBONE_CLASSES = {{{config_class.model_type!r}: ({config_class.__name__}, {model_class.__name__})}}\n"
    )
    return sorted(files)


class HirePreTrainedModel(PreTrainedModel):
    config_class = HireConfig
    config: HireConfig
    base_model_prefix = "hire"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True

    def _flex_attn_can_dispatch(self, is_init_check: bool = False) -> bool:
        raise ValueError(
            "HIRE does not support attn_implementation='flex_attention': it hands the setting to its encoder, which "
            "it runs under 'sdpa' (the default), 'eager' or flash attention only; load it with one of those."
        )

    @property
    def backbone_model(self) -> PreTrainedModel:
        return self.backbone if isinstance(self, HireModel) else self.hire.backbone

    @torch.no_grad()
    def _init_weights(self, module):
        backbone = self.backbone_model
        if id(module) in self.__dict__.setdefault("_backbone_module_ids", {id(m) for m in backbone.modules()}):
            backbone._init_weights(module)  # the encoder's own init, buffers included
        elif isinstance(module, HireExtractor):
            init.copy_(module.fixed_scores, fixed_layer_scores(self.config))
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, std=self.config.initializer_range)
            # The scorer's bias starts at 1 so every layer's ReLU(w^T u + b) starts in its linear region: at 0, all
            # scores can start clipped, leaving s uniform and untrainable (the paper gives no initialisation).
            init.constant_(module.bias, 1.0 if isinstance(module, HireImportanceScorer) else 0.0)
        # GRUs keep PyTorch's initialisation.

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Also saves the encoder's code when it is remote code (see `hire_backbone.py`)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            save_backbone_code(self.backbone_model, Path(save_directory))

    def get_input_embeddings(self):
        return self.backbone_model.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.backbone_model.set_input_embeddings(value)

    def resize_token_embeddings(self, *args, **kwargs):
        """Resizes the encoder's embeddings and keeps `backbone_config.vocab_size` in step, so the checkpoint
        reloads."""
        embeddings = self.backbone_model.resize_token_embeddings(*args, **kwargs)
        self.config.backbone_config.vocab_size = self.vocab_size = embeddings.num_embeddings
        return embeddings


class HireModel(HirePreTrainedModel):
    """Encoder + HIRE + fusion network: returns F and the layer importance scores."""

    # A HIRE export holds its classifier too (init_hire.py saves one); the bare model does not read it.
    _keys_to_ignore_on_load_unexpected = [r"^classifier\."]

    def __init__(self, config: HireConfig):
        super().__init__(config)
        self.backbone = build_backbone(config.backbone_config)
        self.extractor = HireExtractor(config) if config.use_hire else None
        self.fusion = None
        if config.use_fusion and config.fusion_layers > 0:
            self.fusion = MaskedBiGRU(4 * config.model_dim, config.gru_dim, config.fusion_layers, config.gru_dropout)
        self.post_init()

    @property
    def output_dim(self) -> int:
        return self.config.hidden_size

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                output_hidden_states=None, output_attentions=None, **kwargs) -> HireModelOutput:
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        reference = input_ids if input_ids is not None else inputs_embeds
        check_input_length(self.backbone, reference, position_ids)
        if attention_mask is None:
            attention_mask = torch.ones(reference.shape[:2], dtype=torch.long, device=reference.device)
        # Run right-padded whatever the caller's layout: the GRUs read each sequence from its first real token.
        order = right_aligned_order(attention_mask)
        attention_mask = gather_positions(attention_mask, order)
        backbone_inputs = dict(input_ids=gather_positions(input_ids, order),
                               attention_mask=attention_mask,
                               position_ids=gather_positions(position_ids, order),
                               inputs_embeds=gather_positions(inputs_embeds, order),
                               output_hidden_states=True, return_dict=True)
        if output_attentions:
            backbone_inputs["output_attentions"] = True
        if token_type_ids is not None:
            backbone_inputs["token_type_ids"] = gather_positions(token_type_ids, order)
        encoded = self.backbone(**backbone_inputs)
        lengths = attention_mask.sum(-1)
        width = attention_mask.shape[1]
        if not torch.compiler.is_compiling():  # data-dependent checks stay out of compiled graphs
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
        # Zeros at padding, whatever the batch's longest input (the GRUs leave garbage there).
        output = output * attention_mask[..., None].to(output.dtype)
        inverse = order.argsort(dim=1)  # back to the caller's layout
        return HireModelOutput(
            last_hidden_state=gather_positions(output, inverse),
            layer_importance=importance,
            hidden_states=self.selected_hidden_states(encoded.hidden_states, inverse, output_hidden_states),
            attentions=tuple(gather_attention(a, inverse) for a in encoded.attentions) if output_attentions else None,
        )


    @staticmethod
    def selected_hidden_states(hidden_states, inverse, output_hidden_states):
        """The encoder's hidden states in the caller's layout: all of them, or (`output_hidden_states` an index or a
        list of indices, as transformers' models take it) those selected, None in the other places."""
        if not output_hidden_states:
            return None
        count = len(hidden_states)
        keep = range(count)
        if not isinstance(output_hidden_states, bool):
            indices = [output_hidden_states] if isinstance(output_hidden_states, int) else output_hidden_states
            keep = {i % count for i in indices if -count <= i < count}
        return tuple(gather_positions(h, inverse) if i in keep else None for i, h in enumerate(hidden_states))


class HireRobertaForSequenceClassification(HirePreTrainedModel):
    """HIRE + fusion over a pretrained encoder with the paper's output layer `W2 tanh(W1 c + b1) + b2` on the first
    real token. Cross-entropy for classification, MSE for regression (`num_labels == 1`).

    Checkpoints saved before the head moved into `classifier` (keys `dense.*`, `out_proj.*`, `hire.extractor.score.*`)
    load with `from_pretrained(path, key_mapping={"^dense": "classifier.dense", "^out_proj": "classifier.out_proj",
    "extractor.score": "extractor.importance"})`.
    """

    def __init__(self, config: HireConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.hire = HireModel(config)
        self.classifier = HireClassificationHead(config, self.hire.output_dim)
        self.post_init()

    @classmethod
    def from_backbone_pretrained(cls, path_or_id: str, num_labels: int = 2, **hire_options):
        """A new HIRE classifier over pretrained encoder weights (e.g. `roberta-large`, a local MiniLM or a zoo export,
        whose code is then saved with HIRE's)."""
        backbone = AutoModel.from_pretrained(path_or_id, trust_remote_code=hire_options.pop("trust_remote_code", None))
        model = cls(HireConfig(backbone_config=backbone.config, num_labels=num_labels, **hire_options))
        missing, unexpected = model.hire.backbone.load_state_dict(backbone.state_dict(), strict=False)
        if missing:
            raise ValueError(f"Backbone weights from {path_or_id} lack {missing[:5]}.")
        return model

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_hidden_states=None, output_attentions=None,
                **kwargs) -> HireSequenceClassifierOutput:
        outputs = self.hire(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            position_ids=position_ids, inputs_embeds=inputs_embeds,
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                            return_dict=True)
        hidden = outputs.last_hidden_state
        # c: the first real token (<s>), wherever the padding is.
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        first = attention_mask.int().argmax(dim=1) if attention_mask is not None else torch.zeros_like(rows)
        logits = self.classifier(hidden[rows, first])
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return HireSequenceClassifierOutput(loss=loss, logits=logits, layer_importance=outputs.layer_importance,
                                            hidden_states=outputs.hidden_states, attentions=outputs.attentions)


__all__ = ["HirePreTrainedModel", "HireModel", "HireRobertaForSequenceClassification", "HireExtractor",
           "HireModelOutput", "MaskedBiGRU"]
