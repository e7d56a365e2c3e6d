"""What installed packages add to the zoo's registries through entry points (CONTRIBUTING.md, "Extending the zoo"):
the modules of one entry point group, and a registry merged with what those modules declare, a name declared twice
refused. `models/` reads its own group itself: a model folder imports nothing from `training/`."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from types import ModuleType


def plugin_modules(group: str) -> Iterator[ModuleType]:
    """The module each entry point of `group` names, imported."""
    for entry_point in importlib.metadata.entry_points(group=group):
        yield entry_point.load()


def merged_with_plugins(built_in: dict, group: str, attribute: str, where: str, kind: str) -> dict:
    """`built_in` (declared in `where`) and what every module of `group` declares as `attribute` (a dict name -> item,
    or a list of items with a `name`); a `kind` declared twice is refused, naming both places."""
    merged, owners = dict(built_in), dict.fromkeys(built_in, where)
    for module in plugin_modules(group):
        declared = getattr(module, attribute, {})
        items = declared.items() if isinstance(declared, dict) else ((item.name, item) for item in declared)
        for name, item in items:
            if name in merged:
                raise ValueError(f"The {kind} {name!r} of {module.__name__}.{attribute} clashes with the {kind} "
                                 f"{name!r} of {owners[name]}; rename the plugin's {kind}.")
            merged[name], owners[name] = item, f"{module.__name__}.{attribute}"
    return merged
