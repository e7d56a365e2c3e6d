"""Every family declares what the rest of the project reads of it (`FAMILY` beside its recipes, `training/recipes/`;
LoRA targets and the FSDP layer in its model folder), and each declaration fits the models it is about: FLOP kinds
that a tiny pretraining model gets and counts, LoRA targets and FSDP layers that are modules of the models, fine-tuning
presets that run_glue parses, common-test settings that build the family's models."""

from types import SimpleNamespace

import pytest
import torch

from encoder_zoo import models
from encoder_zoo.training.recipes import (
    CLIENTS,
    ClientColumn,
    all_recipes,
    client_columns,
    families,
    family_of_model_type,
    flop_kinds,
    glue_presets,
    pretraining_kind,
    train_step_flops,
)
from encoder_zoo.training.recipes.registry import family_modules, recipe_modules

# The sizes transformers' BertModelTester gives every common test (tests/test_transformers_common.py).
COMMON_TEST_SIZES = dict(batch_size=3, seq_length=7, vocab_size=99, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=37, type_vocab_size=2, num_labels=3)


def tiny_pretraining_model(recipe):
    config = models.get_class(recipe.family, "AutoConfig")(**recipe.sizes["tiny"], **recipe.config_overrides,
                                                           vocab_size=120, pad_token_id=0, bos_token_id=1,
                                                           eos_token_id=2)
    torch.manual_seed(0)
    return models.get_class(recipe.family, "AutoModelForPreTraining")(config)


def common_test_models(spec) -> dict[str, torch.nn.Module]:
    """Auto class name -> the model a common-test declaration builds for it."""
    tester = SimpleNamespace(**{**COMMON_TEST_SIZES, **spec.tester})
    classes = models.REGISTRY[spec.model_type]
    heads = spec.heads or [name for name in classes if name != "AutoConfig"]
    return {name: classes[name](spec.config(tester)) for name in heads}


def test_every_model_folder_declares_its_family_once():
    assert sorted(families()) == models.FAMILIES
    # HIRE has no pretraining recipe: a module of its own declares its family, and it is no recipe module.
    assert "encoder_zoo.training.recipes.hire" in family_modules()
    assert "encoder_zoo.training.recipes.hire" not in recipe_modules()
    assert all(family_of_model_type(t).name == name for name, family in families().items() for t in family.model_types)
    assert family_of_model_type("bertac_cnn").name == "bertac" and family_of_model_type("bert") is None


@pytest.mark.parametrize("name", sorted(all_recipes()))
def test_every_pretraining_recipe_is_counted_or_explicitly_not(name):
    recipe = all_recipes()[name]
    family = family_of_model_type(recipe.family)
    assert family is not None, f"--model {name}: no family declares model type {recipe.family!r}"
    if family.flops is None:  # declared uncounted (flops=None has no default): Trainer's estimate
        return
    model = tiny_pretraining_model(recipe)
    inputs = {"input_ids": torch.randint(5, 120, (2, 12)), "attention_mask": torch.ones(2, 12, dtype=torch.long)}
    inputs["labels"] = torch.full_like(inputs["input_ids"], -100)
    inputs["labels"][:, 2:5] = inputs["input_ids"][:, 2:5]
    if recipe.default_masking_scheme == "span":
        inputs["span_left"], inputs["span_right"] = torch.full((2, 12), -1), torch.full((2, 12), -1)
        inputs["span_left"][:, 2:5], inputs["span_right"][:, 2:5] = 1, 5
    kind = pretraining_kind(model, inputs)
    assert kind in family.flops.kinds and flop_kinds()[kind] is family
    flops = train_step_flops(kind, model, inputs)
    # At least the three weight matrices of every layer, forward and backward, for every real token.
    layers = model.config.num_hidden_layers
    assert flops > 6 * 24 * layers * 3 * model.config.hidden_size ** 2
    # More real tokens, more FLOPs: the count reads the batch, not only the model.
    inputs["attention_mask"][1, 8:] = 0
    assert train_step_flops(kind, model, inputs) < flops
    assert pretraining_kind(model, {"input_ids": inputs["input_ids"]}) is None  # no targets: nothing to count


def test_flop_kinds_are_unique_and_an_unknown_kind_is_refused():
    kinds = flop_kinds()
    assert sum(len(f.flops.kinds) for f in families().values() if f.flops) == len(kinds)
    assert {"spanbert", "bert", "teams", "electra", "cloze"} <= set(kinds)
    with pytest.raises(ValueError, match="unknown kind 'no_such_kind'"):
        train_step_flops("no_such_kind", None, {})


@pytest.mark.parametrize("name", sorted(families()))
def test_every_family_has_lora_targets_that_are_modules_of_its_models(name):
    family = families()[name]
    targets = family.peft_target_modules
    assert targets, f"{name}: no PEFT_TARGET_MODULES in models/{name}/__init__.py"
    # Every model type with a classification head (the one LoRA fine-tunes) has targets.
    heads = [t for t in family.model_types if "AutoModelForSequenceClassification" in models.REGISTRY[t]]
    assert set(heads) <= set(targets)
    built = {spec.model_type: common_test_models(spec) for spec in family.common_tests}
    for model_type, modules in targets.items():
        assert model_type in built, f"{name}: no common-test declaration builds a {model_type} model"
        names = {module_name.rsplit(".", 1)[-1] for model in built[model_type].values()
                 for module_name, _ in model.named_modules()}
        assert set(modules) <= names, f"{model_type}: LoRA targets {modules} are not all module names"


def test_every_fsdp_layer_class_is_a_layer_of_its_pretraining_models():
    declared = {t: layer for family in families().values() for t, layer in family.fsdp_layer_classes.items()}
    assert {"spanbert": "BertLayer", "teams": "ElectraLayer", "cloze": "TwoTowerClozeBlock"}.items() <= declared.items()
    for recipe in all_recipes().values():
        if recipe.family in declared:
            classes = {type(module).__name__ for module in tiny_pretraining_model(recipe).modules()}
            assert declared[recipe.family] in classes, recipe.name


def test_every_glue_preset_belongs_to_one_family_and_parses(tmp_path):
    from encoder_zoo.glue.run_glue import PRESETS, parse_args
    from encoder_zoo.glue.tasks import get_task

    owners = {preset: name for name, family in families().items() for preset in family.glue_presets}
    assert set(owners) == set(glue_presets()) == set(PRESETS)
    assert sum(len(family.glue_presets) for family in families().values()) == len(owners)
    assert {"spanbert", "teams_small", "teams_base", "cloze", "hire", "bertac"} <= set(owners)
    for preset, name in owners.items():
        declared = PRESETS[preset]
        _, training_args, _ = parse_args(["--model_name_or_path", "m", "--preset", preset,
                                          "--output_dir", str(tmp_path)])
        flags = dict(zip(declared.flags[::2], declared.flags[1::2]))
        assert training_args.learning_rate == float(flags["--learning_rate"]), preset
        for task in declared.epochs_by_task:
            get_task(task)  # a task run_glue knows
        if declared.config:  # fields of the family's config, set when the model is loaded
            configs = [models.get_class(t, "AutoConfig")() for t in families()[name].model_types]
            assert any(all(hasattr(config, key) for key in declared.config) for config in configs), preset


def test_common_test_declarations_build_their_models():
    specs = [spec for family in families().values() for spec in family.common_tests]
    assert len({spec.name for spec in specs}) == len(specs)
    for name, family in families().items():
        assert family.common_tests, f"{name}: no transformers common tests declared"
        for spec in family.common_tests:
            assert spec.model_type in family.model_types, spec.name
            built = common_test_models(spec)
            assert set(spec.pretraining_heads) <= set(built) and set(spec.seeded_forward) <= set(built)
            config = next(iter(built.values())).config
            assert config.model_type == spec.model_type
            for model in built.values():
                assert sum(p.numel() for p in model.parameters()) < 2_000_000, f"{spec.name}: not a tiny config"


def test_client_matrix_columns_name_known_clients_and_every_common_test_column():
    """Each family's columns of the client matrix (tests/test_clients.py builds and runs them) list clients of the one
    vocabulary; every column a family's common tests add their count to is one of them."""
    columns = client_columns()
    assert all(set(column.clients) <= set(CLIENTS) and column.clients for column in columns.values())
    assert {spec.works_with_column for family in families().values() for spec in family.common_tests} <= set(columns)
    with pytest.raises(ValueError, match="'fill mask', no client of the matrix"):
        ClientColumn("toy", ("fill mask",), build=None)


def test_a_recipe_logs_the_outputs_its_config_trains():
    """The two-tower model logs the losses its loss_type trains (repro gives an arm floors for those only); a recipe
    that declares no rule logs all its outputs."""
    cloze, teams = all_recipes()["cloze"], all_recipes()["teams"]
    assert cloze.logs() == ("cloze_loss",) and cloze.logs({"loss_type": "bilm"}) == ("bilm_loss",)
    assert cloze.logs({"loss_type": "cloze+bilm"}) == ("cloze_loss", "bilm_loss")
    assert teams.logs({"rtd_loss_weight": 1.0}) == teams.logged_outputs


def test_a_family_module_is_found_not_listed_and_clashes_are_refused(tmp_path, monkeypatch):
    """A module beside the recipes that defines FAMILY is a family, with no list to edit; a folder declared twice, a
    family of no model folder, and a preset, FLOP kind or client column two families both declare are refused."""
    import sys

    import encoder_zoo.training.recipes as package

    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.setitem(models.MODEL_TYPES, "toy", ["toy"])  # as if models/toy/ were there

    def declare(family: str):
        (tmp_path / "toy_family.py").write_text(
            "from encoder_zoo.training.recipes import ClientColumn, Family, FineTuningPreset\n"
            "from encoder_zoo.training.run.flops import FlopCount\n"
            f"FAMILY = {family}\n")
        monkeypatch.delitem(sys.modules, "encoder_zoo.training.recipes.toy_family", raising=False)

    declare("Family(name='toy', flops=None, glue_presets={'toy': FineTuningPreset(flags=['--learning_rate', '1e-3'])})")
    assert families()["toy"].model_types == ["toy"] and family_of_model_type("toy").name == "toy"
    assert glue_presets()["toy"].flags == ["--learning_rate", "1e-3"]
    declare("Family(name='spanbert', flops=None)")
    with pytest.raises(ValueError, match="'spanbert' is declared twice"):
        families()
    declare("Family(name='nowhere', flops=None)")
    with pytest.raises(ValueError, match="'nowhere', which is no folder under models/"):
        families()
    declare("Family(name='toy', flops=None, client_matrix=(ClientColumn('electra', (), None),))")
    with pytest.raises(ValueError, match="client column 'electra' is declared by teams and toy"):
        client_columns()
    declare("Family(name='toy', flops=None, glue_presets={'hire': FineTuningPreset(flags=[])})")
    with pytest.raises(ValueError, match="--preset 'hire' is declared by hire and toy"):
        glue_presets()
    declare("Family(name='toy', flops=FlopCount(kinds=('bert',), choose=None, count=None))")
    with pytest.raises(ValueError, match="kind 'bert' is declared by spanbert and toy"):
        flop_kinds()
