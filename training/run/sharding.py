"""Sharded runs (FSDP2, DeepSpeed) of the zoo's pretraining models under accelerate and Trainer.

FSDP2 plan. Each transformer layer is one FSDP unit; everything else (embeddings, tied decoders, task heads) stays in
the root unit, as FSDP1's transformer auto-wrap did. accelerate 1.15's own FSDP2 plan also carves the input
embeddings into a unit of their own, which breaks models that use the word-embedding matrix outside the embedding
module: torch refuses SpanBERT (its SBO decoder shares that matrix with the MLM decoder) and TEAMS would meet a
sharded matrix in its generator's output layer and MWS candidates. So the plan is applied here, before the optimizer
is built, and accelerate, finding the model already sharded, keeps it. The layer class comes from the accelerate
config (`fsdp_transformer_layer_cls_to_wrap`), else from the family (`LAYER_CLASSES`, which each model folder declares
in its `__init__.py`). TEAMS's shared layers are single modules that the generator and the discriminator both call:
each is one unit, one set of parameters.

Export. Whatever the engine, `unsharded_model` gathers the full weights (every process takes part) and the main
process writes the export from a plain model holding them.
"""

from __future__ import annotations

import os

import torch

from encoder_zoo import models

# The transformer layer class of each pretraining model type: one FSDP unit each (declared in its model folder).
LAYER_CLASSES = models.FSDP_LAYER_CLASSES


def is_fsdp2(trainer) -> bool:
    return trainer.is_fsdp_enabled and getattr(trainer.accelerator.state.fsdp_plugin, "fsdp_version", 1) == 2


def shard_model(model: torch.nn.Module, accelerator) -> None:
    """Apply the FSDP2 plan (module docstring) to `model` in place, with the accelerate config's settings."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    if isinstance(model, FSDPModule):
        return
    plugin = accelerator.state.fsdp_plugin
    if plugin.activation_checkpointing:
        raise ValueError("fsdp_activation_checkpointing is not supported with the zoo's FSDP plan: set it to false in "
                         "the accelerate config.")
    policy = getattr(plugin.auto_wrap_policy, "func", plugin.auto_wrap_policy)
    if policy is size_based_auto_wrap_policy:
        raise ValueError("fsdp_auto_wrap_policy SIZE_BASED_WRAP would split the models' layers arbitrarily: use "
                         "TRANSFORMER_BASED_WRAP (training/accelerate_configs/fsdp_*.yaml).")
    present = {type(module).__name__ for module in model.modules()}
    known = sorted(present & set(LAYER_CLASSES.values()))
    names = plugin.transformer_cls_names_to_wrap or known
    if policy is None:  # NO_WRAP: the whole model is one unit
        names = []
    elif not names:
        raise ValueError(f"{type(model).__name__} has no transformer layers to shard "
                         f"({', '.join(sorted(set(LAYER_CLASSES.values())))}); train it with DDP "
                         "(training/accelerate_configs/ddp.yaml).")
    missing = [name for name in names if name not in present]
    if missing:
        raise ValueError(f"fsdp_transformer_layer_cls_to_wrap names {', '.join(missing)}, which {type(model).__name__} "
                         f"does not have; its layer class is {', '.join(known) or 'none'} (see "
                         "training/accelerate_configs/).")
    mesh = getattr(accelerator, "torch_device_mesh", None)
    kwargs = {
        "offload_policy": plugin.cpu_offload,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
        "mesh": mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)] if mesh is not None else None,
    }
    for module in list(model.modules())[::-1]:  # bottom-up, though the layers do not nest
        if type(module).__name__ in names:
            fully_shard(module, reshard_after_forward=plugin.reshard_after_forward, **kwargs)
    fully_shard(model, **kwargs)
    # The plan is applied: accelerate's auto-wrap must not look for the (now FSDP-wrapped) layer classes again.
    plugin.auto_wrap_policy = None


def check_engine(trainer) -> None:
    """A launch that asks for FSDP or DeepSpeed must get it, not a silent fallback to unsharded DDP (accelerate 1.15
    enables both on accelerators only)."""
    for engine, variable, enabled in (("FSDP", "ACCELERATE_USE_FSDP", trainer.is_fsdp_enabled),
                                      ("DeepSpeed", "ACCELERATE_USE_DEEPSPEED", trainer.is_deepspeed_enabled)):
        if os.environ.get(variable, "false").lower() == "true" and not enabled:
            raise ValueError(f"The accelerate config asks for {engine}, which accelerate runs on GPUs only: on this "
                             "machine every process would hold the whole model (DDP). Launch with "
                             "training/accelerate_configs/ddp.yaml here.")


def unsharded_model(trainer, model_class, config) -> torch.nn.Module | None:
    """The trained model with its full weights, on the main process (None elsewhere). Every process must call it:
    under FSDP or DeepSpeed ZeRO the weights are gathered from all of them into a plain `model_class(config)`."""
    accelerator = trainer.accelerator
    if not (trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled):
        return accelerator.unwrap_model(trainer.model) if trainer.is_world_process_zero() else None
    state_dict = accelerator.get_state_dict(trainer.model)  # full weights, on the main process's CPU
    if not trainer.is_world_process_zero():
        return None
    model = model_class(config)
    missing, unexpected = model.load_state_dict({k: v.float() if v.is_floating_point() else v
                                                 for k, v in state_dict.items()},
                                                strict=False)
    tied = {key for key in missing if key in (getattr(model, "_tied_weights_keys", None) or {})}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"The gathered weights do not fit {model_class.__name__}: missing "
                           f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}.")
    model.tie_weights()
    return model
