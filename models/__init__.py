"""Model zoo families, registered with transformers' Auto classes.

Every family lives in one self-contained folder ``models/<family>/`` holding ``configuration_<family>.py`` and
``modeling_<family>.py``. The configuration module declares ``AUTO_MAP``: the Auto class -> ``module.Class`` map
that is written into every saved ``config.json``, so one export loads through every Auto class with
``trust_remote_code=True``. A folder that holds several model types (BERTAC: its CNN and the fused model) declares
``AUTO_MAPS`` instead, one such map per model type. This module reads those same maps to register the classes
locally, so the maps are the single source of truth.

A folder's ``__init__.py`` names what clients outside it need to know of its modules, per model type:
``PEFT_TARGET_MODULES`` (LoRA's default targets) and ``FSDP_LAYER_CLASSES`` (the layer FSDP shards as one unit).
This module collects them; the rest of what a family declares is beside its recipes (``training/recipes/``).

An installed package adds a family folder through the entry point group ``encoder_zoo.models`` (name: the family;
value: the importable package that is its folder), registered exactly as a folder here.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil

import transformers

PLUGIN_GROUP = "encoder_zoo.models"


def plugin_families():
    """(family, package) of each family folder an installed package adds (entry point group ``encoder_zoo.models``)."""
    for entry_point in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        yield entry_point.name, entry_point.value


def _family_packages() -> dict[str, str]:
    """Family -> the package that is its folder: the folders here, then the plugins' (a name of both is refused)."""
    packages = {info.name: f"{__name__}.{info.name}"
                for info in pkgutil.iter_modules(__path__) if info.ispkg and not info.name.startswith("_")}
    for family, package in plugin_families():
        if family in packages:
            raise ValueError(f"The {PLUGIN_GROUP} entry point {family!r} ({package}) clashes with the family "
                             f"{family!r} of {packages[family]}; rename the plugin's family.")
        packages[family] = package
    return packages


PACKAGES: dict[str, str] = _family_packages()
FAMILIES: list[str] = sorted(PACKAGES)


def _auto_maps(family: str) -> dict[str, dict[str, str]]:
    """Registry name -> auto_map: the family's own name for an ``AUTO_MAP``, each model type for ``AUTO_MAPS``."""
    configuration = importlib.import_module(f"{PACKAGES[family]}.configuration_{family}")
    return getattr(configuration, "AUTO_MAPS", None) or {family: configuration.AUTO_MAP}


def _register(family: str, auto_map: dict[str, str]) -> dict[str, type]:
    classes = {}
    for auto_name, target in auto_map.items():
        module_name, class_name = target.split(".")
        classes[auto_name] = getattr(importlib.import_module(f"{PACKAGES[family]}.{module_name}"), class_name)
    config_class = classes["AutoConfig"]
    transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    config_class.register_for_auto_class("AutoConfig")
    for auto_name, cls in classes.items():
        if auto_name == "AutoConfig":
            continue
        getattr(transformers, auto_name).register(config_class, cls, exist_ok=True)
        cls.register_for_auto_class(auto_name)
    return classes


# Keyed by family, or by model type for the folders that declare AUTO_MAPS ("bertac_cnn").
REGISTRY: dict[str, dict[str, type]] = {
    name: _register(family, auto_map) for family in FAMILIES for name, auto_map in _auto_maps(family).items()
}


def get_class(family: str, auto_name: str) -> type:
    """The class a family (or a model type of a several-type folder) registers for an Auto class, e.g.
    ``get_class("spanbert", "AutoModelForPreTraining")`` or ``get_class("bertac_cnn", "AutoModel")``."""
    if family not in REGISTRY:
        raise KeyError(f"Unknown model family {family!r}; available: {', '.join(REGISTRY)}")
    if auto_name not in REGISTRY[family]:
        raise KeyError(f"Family {family!r} has no class for {auto_name}; it has {', '.join(REGISTRY[family])}")
    return REGISTRY[family][auto_name]


# Model types of each family folder: the family's own name, or the keys of its AUTO_MAPS (BERTAC: bertac_cnn, bertac).
MODEL_TYPES: dict[str, list[str]] = {family: list(_auto_maps(family)) for family in FAMILIES}


def _folder(family: str) -> str:
    """Where a family's folder is, as an error names it: `models/spanbert`, `my_pkg/myfamily` for a plugin's."""
    return PACKAGES[family].removeprefix(f"{__name__.rsplit('.', 1)[0]}.").replace(".", "/")


def _collect(name: str) -> dict:
    """Model type -> value, merged from the families' `models/<family>/__init__.py` constant `name`."""
    found = {}
    for family in FAMILIES:
        for model_type, value in getattr(importlib.import_module(PACKAGES[family]), name, {}).items():
            if model_type not in MODEL_TYPES[family]:
                raise ValueError(f"{_folder(family)}/__init__.py: {name} names {model_type!r}, not a model type of "
                                 f"the folder ({', '.join(MODEL_TYPES[family])}).")
            found[model_type] = value
    return found


# LoRA's default `target_modules` per model type (each folder's `PEFT_TARGET_MODULES`). PEFT keys its defaults by
# built-in model types, so pass these (README: "Works with").
PEFT_TARGET_MODULES: dict[str, list[str]] = _collect("PEFT_TARGET_MODULES")
# The transformer layer class of each pretraining model type that FSDP shards as one unit (`FSDP_LAYER_CLASSES`).
FSDP_LAYER_CLASSES: dict[str, str] = _collect("FSDP_LAYER_CLASSES")


def register_peft_target_modules() -> None:
    """Let `LoraConfig()` without `target_modules` work for the zoo's model types (needs `peft`)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    for model_type, modules in PEFT_TARGET_MODULES.items():
        TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.setdefault(model_type, modules)
