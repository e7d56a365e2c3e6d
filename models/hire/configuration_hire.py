"""HIRE configuration (Yang and Zhao, 2019, "Deepening Hidden Representations from Pre-trained Language Models",
arXiv:1911.01940: a HIdden Representation Extractor + fusion network over a pretrained encoder)."""

from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .hire_backbone import BACKBONE_CLASSES

AUTO_MAP = {
    "AutoConfig": "configuration_hire.HireConfig",
    "AutoModel": "modeling_hire.HireModel",
    "AutoModelForSequenceClassification": "modeling_hire.HireRobertaForSequenceClassification",
}


@strict
class HireConfig(PreTrainedConfig):
    r"""
    HIRE over any transformers encoder (RoBERTa in the paper), stored as a nested `backbone_config`.

    The encoder may be remote code (a zoo model such as SpanBERT, or any `trust_remote_code` encoder): `save_pretrained`
    then copies its modeling files next to HIRE's (see `hire_backbone.py`), so the checkpoint loads anywhere.

    Args:
        backbone_config: Config of the encoder (any `AutoConfig`; RoBERTa-large in the paper). Built with
            `AutoModel.from_config` (or the encoder classes saved with the checkpoint) and run with all hidden states.
        gru_hidden_size: d, the hidden size of every GRU per direction. `None` uses the encoder's hidden size, as the
            paper does (u_i is 4d, F is 2d).
        gru_dropout: Dropout inside the GRUs of the extractor and the fusion network (0.1, appendix A.2), applied
            where `nn.GRU(dropout=...)` applies it: on the outputs of every stacked GRU layer but the last, i.e. between
            layers. (The GRUs' inputs already went through the encoder's own dropout.)
        use_hire: `False` removes the extractor: `M = [R; R; R+R; R*R]` (Table 4, "w/o HIRE").
        use_fusion: `False` removes the fusion network: the extractor's output A goes to the output layer
            (Table 4, "w/o Fusion network").
        fusion_layers: GRU layers of the fusion network, 0 to 3 (Table 6; 0 feeds M itself to the output layer).
        layer_weighting: `dynamic` (per-example scores from the extractor, the paper's method), or the fixed
            weightings of Table 5: `mean` (equal weights) or `random` (softmax of random scores drawn once). The fixed
            weightings build no summarising GRU and no scorer.
        layer_selection: Layers the fixed weightings cover: `all`, `first_k` or `last_k` (Table 5).
        num_selected_layers: k for `first_k` / `last_k` (6 in the paper).
        classifier_dropout: Dropout on the first-token representation before the output layer.
        random_weighting_seed: Seed of the `random` fixed scores (stored in the checkpoint as a buffer).
        initializer_range: Std of the N(0, std) init of HIRE's Linear layers.
        pad_token_id / bos_token_id / eos_token_id: The encoder's special tokens (default: copied from
            `backbone_config`), so Trainer finds them where it looks.
    """

    model_type = "hire"
    sub_configs_defaults = {"backbone_config": SubConfigSpec(config_class=AutoConfig, model_type="roberta")}

    backbone_config: dict | PreTrainedConfig | None = None
    gru_hidden_size: int | None = None
    gru_dropout: float | int = 0.1
    use_hire: bool = True
    use_fusion: bool = True
    fusion_layers: int = 2
    layer_weighting: Literal["dynamic", "mean", "random"] = "dynamic"
    layer_selection: Literal["all", "first_k", "last_k"] = "all"
    num_selected_layers: int = 6
    classifier_dropout: float = 0.1
    random_weighting_seed: int = 0
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self, **kwargs):
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        if isinstance(self.backbone_config, dict):
            self.backbone_config = self._backbone_from_dict(self.backbone_config)
        super().__post_init__(**kwargs)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(self.backbone_config, name, None))
        if not 0 <= self.fusion_layers <= 3:
            raise ValueError(f"fusion_layers must be 0 to 3 (the paper's Table 6), got {self.fusion_layers}.")
        if self.layer_weighting == "dynamic" and self.layer_selection != "all":
            raise ValueError("layer_selection applies to the fixed weightings (mean, random); dynamic scores cover all "
                             "layers.")
        if self.layer_selection != "all" and not 1 <= self.num_selected_layers <= self.num_layers:
            raise ValueError(f"num_selected_layers must be within 1..{self.num_layers}, "
                             f"got {self.num_selected_layers}.")
        if not 0 <= self.gru_dropout < 1:
            raise ValueError(f"gru_dropout must be in [0, 1), got {self.gru_dropout}.")

    @staticmethod
    def _backbone_from_dict(backbone: dict) -> PreTrainedConfig | dict:
        """An encoder saved with this checkpoint's code first, then any encoder transformers knows (built in, or
        registered in this process); a dict without `model_type` is left to the RoBERTa default."""
        model_type = backbone.get("model_type")
        if model_type in BACKBONE_CLASSES:
            return BACKBONE_CLASSES[model_type][0].from_dict(backbone)
        if model_type is not None and model_type not in CONFIG_MAPPING:
            raise ValueError(
                f"backbone_config has model_type {model_type!r}, which transformers does not know and this checkpoint "
                "carries no code for. Register the encoder's classes (e.g. `import encoder_zoo.models`) or load it "
                "with trust_remote_code=True before building HIRE, and save HIRE again: its code then travels with "
                "it."
            )
        return backbone

    def get_text_config(self, decoder=None, encoder=None) -> PreTrainedConfig:
        """The encoder's config: where transformers, PEFT and other clients read the text model's sizes
        (`vocab_size`, `hidden_size`, ...), and where `resize_token_embeddings` records the new vocabulary size."""
        return self.backbone_config

    def to_dict(self):
        output = super().to_dict()
        if isinstance(output.get("backbone_config"), dict):
            output["backbone_config"]["_name_or_path"] = ""  # a local path has no place in a Hub folder
        return output

    @property
    def num_layers(self) -> int:
        """l + 1: the embeddings and every encoder layer."""
        return self.backbone_config.num_hidden_layers + 1

    @property
    def model_dim(self) -> int:
        """The width of the encoder's hidden states: its hidden size, or `hidden_states_size` where its layers'
        states are wider (the two-tower cloze model concatenates its towers: 2d)."""
        return getattr(self.backbone_config, "hidden_states_size", self.backbone_config.hidden_size)

    @property
    def gru_dim(self) -> int:
        return self.gru_hidden_size or self.backbone_config.hidden_size

    @property
    def hidden_size(self) -> int:
        """The width of `HireModel`'s `last_hidden_state` (what sentence-transformers and other clients read)."""
        if not self.use_fusion:
            return self.model_dim
        return 2 * self.gru_dim if self.fusion_layers > 0 else 4 * self.model_dim


__all__ = ["HireConfig", "AUTO_MAP"]
