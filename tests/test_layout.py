"""The layout CONTRIBUTING.md describes, checked from the code's own imports: no import cycle, no wing of
`training/` importing from a wing above it, `glue/` and `qa/` reaching `training/` only through its public
`training.run` and `training.recipes` modules, and model families that import nothing of the project outside their
own folder."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("models", "training", "glue", "qa", "hub_cards", "repro")
# Wings of training/, bottom to top: a module may import from its own wing or one below it, never above.
TRAINING_WINGS = ("masking", "data", "run", "recipes", "<entry points>")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["encoder_zoo", *parts])


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for root in ROOTS for path in (REPO / root).rglob("*.py")}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `path` imports, at module level or inside functions (lazy imports count: they run too)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != "encoder_zoo":
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def training_wing(module: str) -> int | None:
    parts = module.split(".")
    if parts[1] != "training" or len(parts) < 3:
        return None
    return TRAINING_WINGS.index(parts[2]) if parts[2] in TRAINING_WINGS else len(TRAINING_WINGS) - 1


def test_no_import_cycle():
    graph = import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module, path):
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_training_wings_import_only_downwards():
    upward = [f"{module} -> {target}" for module, targets in import_graph().items() for target in targets
              if training_wing(module) is not None and training_wing(target) is not None
              and training_wing(target) > training_wing(module)]
    assert not upward, "imports from a wing above:\n" + "\n".join(sorted(upward))


# training/'s public faces for glue/ and qa/: run plumbing, and the families' declarations (e.g. their fine-tuning
# presets), which sit beside the recipes, above `run`.
PUBLIC_MODULES = ("encoder_zoo.training.run", "encoder_zoo.training.recipes")


def test_fine_tuning_scripts_use_only_the_public_run_module():
    reach = [f"{module} -> {target}" for module, targets in import_graph().items()
             if module.split(".")[1] in ("glue", "qa") for target in targets
             if target.startswith("encoder_zoo.training") and target not in PUBLIC_MODULES]
    assert not reach, ("glue/qa must import training's names from " + " or ".join(PUBLIC_MODULES) + ":\n"
                       + "\n".join(reach))


def test_model_families_are_self_contained():
    outside = [f"{module} -> {target}" for module, targets in import_graph().items()
               if module.count(".") >= 3 and module.split(".")[1] == "models" for target in targets
               if not target.startswith(".".join(module.split(".")[:3]) + ".")
               and target != ".".join(module.split(".")[:3])]
    assert not outside, "a family folder travels alone inside every checkpoint:\n" + "\n".join(outside)


def test_cards_import_nothing_of_training():
    """training/ writes cards (`hub_cards`), so the cards never import training back: what both read (the Hub-origin
    table) lives in hub_cards."""
    upward = [f"{module} -> {target}" for module, targets in import_graph().items()
              if module.split(".")[1] == "hub_cards" for target in targets if target.split(".")[1] == "training"]
    assert not upward, "hub_cards imports from training:\n" + "\n".join(sorted(upward))


def test_the_check_sees_imports():
    """The graph is not empty by mistake: known edges are found, lazy and relative ones included."""
    graph = import_graph()
    assert "encoder_zoo.training.run.trainer" in graph["encoder_zoo.training.recipes.bertac"]
    assert "encoder_zoo.training.run" in graph["encoder_zoo.glue.run_glue"]  # a lazy import inside main
    assert ("encoder_zoo.models.spanbert.configuration_spanbert"
            in graph["encoder_zoo.models.spanbert.modeling_spanbert"])
    assert training_wing("encoder_zoo.training.pretrain") > training_wing("encoder_zoo.training.recipes.registry")
    assert "encoder_zoo.hub_cards.papers" in graph["encoder_zoo.training.recipes.spanbert"]  # training -> hub_cards
