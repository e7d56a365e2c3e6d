"""One-line descriptions of an optimiser, its warmup and its schedule: for `--help` (a recipe's paper values) and
for the card (what a run used, next to the paper's)."""

from __future__ import annotations

from typing import Any


def describe_optimizer(class_name: str, kwargs: dict[str, Any]) -> str:
    """"AdamW (betas 0.9, 0.999; eps 1e-08)", "SGD (Nesterov momentum 0.99)" or "RMSprop (alpha 0.99; eps 1e-08;
    momentum 0; not centered)", from a torch optimizer's defaults."""
    if "betas" in kwargs:
        beta1, beta2 = kwargs["betas"]
        return f"{class_name} (betas {beta1:g}, {beta2:g}; eps {kwargs['eps']:g})"
    if "alpha" in kwargs:  # RMSprop: the decay of its squared-gradient average, eps, momentum, centring
        return (f"{class_name} (alpha {kwargs['alpha']:g}; eps {kwargs['eps']:g}; momentum "
                f"{kwargs.get('momentum', 0):g}; {'centered' if kwargs.get('centered') else 'not centered'})")
    if kwargs.get("momentum"):
        return f"{class_name} ({'Nesterov momentum' if kwargs.get('nesterov') else 'momentum'} {kwargs['momentum']:g})"
    return class_name


def describe_schedule(scheduler_type: str, kwargs: dict[str, Any] | None) -> str:
    """What follows the warmup: "linear decay to 0", "cosine decay to 0.0001", ..."""
    kwargs = kwargs or {}
    if "min_lr" in kwargs:
        return f"cosine decay to {kwargs['min_lr']:g}"
    return {"linear": "linear decay to 0",
            "cosine": "cosine decay to 0"}.get(scheduler_type, f"{scheduler_type} schedule")


def describe_warmup(warmup_steps: int, total_steps: int, scheduler_kwargs: dict[str, Any] | None) -> str:
    """"10000 of 2400000 updates (0.42%)", with the starting rate when the schedule warms up from above 0."""
    start = (scheduler_kwargs or {}).get("warmup_lr_rate")
    share = f" ({warmup_steps / total_steps:.2%})" if total_steps > 0 else ""
    return f"{warmup_steps} of {total_steps} updates{share}" + (f", from {start:g} x lr" if start else "")
