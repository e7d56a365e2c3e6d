"""HIRE configuration (Li et al., 2020, "Dynamic hidden-layer representation extraction and fusion for
fine-tuning", a HIdden Representation Extractor + fusion network over a pretrained encoder)."""

from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

AUTO_MAP = {
    "AutoConfig": "configuration_hire.HireConfig",
    "AutoModel": "modeling_hire.HireModel",
    "AutoModelForSequenceClassification": "modeling_hire.HireRobertaForSequenceClassification",
}


@strict
class HireConfig(PreTrainedConfig):
    r"""
    HIRE over any transformers encoder (RoBERTa in the paper), stored as a nested `backbone_config`.

    Args:
        backbone_config: Config of the encoder (any `AutoConfig`; RoBERTa-large in the paper). Built with
            `AutoModel.from_config` and run with all hidden states.
        gru_hidden_size: d, the hidden size of every GRU per direction. `None` uses the encoder's hidden size, as the
            paper does (u_i is 4d, F is 2d).
        use_hire: `False` removes the extractor: `M = [R; R; R+R; R*R]` (Table 4, "w/o HIRE").
        use_fusion: `False` removes the fusion network: the extractor's output A goes to the output layer
            (Table 4, "w/o Fusion network").
        fusion_layers: GRU layers of the fusion network, 0 to 3 (Table 6; 0 feeds M itself to the output layer).
        layer_weighting: `dynamic` (per-example scores from the extractor, the paper's method), or the fixed
            weightings of Table 5: `mean` (equal weights) or `random` (softmax of random scores drawn once).
        layer_selection: Layers the fixed weightings cover: `all`, `first_k` or `last_k` (Table 5).
        num_selected_layers: k for `first_k` / `last_k` (6 in the paper).
        classifier_dropout: Dropout on the first-token representation before the output layer.
        random_weighting_seed: Seed of the `random` fixed scores (stored in the checkpoint as a buffer).
    """

    model_type = "hire"
    sub_configs_defaults = {"backbone_config": SubConfigSpec(config_class=AutoConfig, model_type="roberta")}

    backbone_config: dict | PreTrainedConfig | None = None
    gru_hidden_size: int | None = None
    use_hire: bool = True
    use_fusion: bool = True
    fusion_layers: int = 2
    layer_weighting: Literal["dynamic", "mean", "random"] = "dynamic"
    layer_selection: Literal["all", "first_k", "last_k"] = "all"
    num_selected_layers: int = 6
    classifier_dropout: float = 0.1
    random_weighting_seed: int = 0
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__post_init__(**kwargs)
        if not 0 <= self.fusion_layers <= 3:
            raise ValueError(f"fusion_layers must be 0 to 3 (the paper's Table 6), got {self.fusion_layers}.")
        if self.layer_weighting == "dynamic" and self.layer_selection != "all":
            raise ValueError("layer_selection applies to the fixed weightings (mean, random); dynamic scores cover all layers.")
        if self.layer_selection != "all" and not 1 <= self.num_selected_layers <= self.num_layers:
            raise ValueError(f"num_selected_layers must be within 1..{self.num_layers}, got {self.num_selected_layers}.")

    @property
    def num_layers(self) -> int:
        """l + 1: the embeddings and every encoder layer."""
        return self.backbone_config.num_hidden_layers + 1

    @property
    def model_dim(self) -> int:
        return self.backbone_config.hidden_size

    @property
    def gru_dim(self) -> int:
        return self.gru_hidden_size or self.backbone_config.hidden_size


__all__ = ["HireConfig", "AUTO_MAP"]
