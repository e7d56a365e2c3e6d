"""Each `--model` trains with its paper's optimiser and schedule: the optimizer and scheduler that Trainer builds from
the resolved arguments, weight-decay groups, warmup scaling, global batch, user overrides, `--help` and the card."""

import math

import pytest
import torch
from torch import nn

from encoder_zoo import models
from encoder_zoo.hub_cards import CardMetadata, write_card
from encoder_zoo.training.pretrain import parse_args, recipe_defaults_help
from encoder_zoo.training.recipes import all_recipes, get_recipe
from encoder_zoo.training.run.export import optimisation_comparison
from encoder_zoo.training.run.trainer import PretrainingTrainer


def tiny_model(recipe_name):
    recipe = get_recipe(recipe_name)
    config = models.get_class(recipe.family, "AutoConfig")(
        **recipe.sizes["tiny"], **recipe.config_overrides, vocab_size=120, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return models.get_class(recipe.family, "AutoModelForPreTraining")(config)


def built(tmp_path, *argv):
    """The optimizer and scheduler Trainer builds for `pretrain.py ARGV` on the recipe's tiny model."""
    args, training_args = parse_args(["--output_dir", str(tmp_path), *argv])
    trainer = PretrainingTrainer(model=tiny_model(args.model), args=training_args,
                                 decay_norms_and_biases=args.decay_norms_and_biases)
    trainer.create_optimizer_and_scheduler(num_training_steps=training_args.max_steps)
    trainer.state.max_steps = training_args.max_steps
    return args, training_args, trainer


def lr_at(trainer, step):
    return trainer.lr_scheduler.base_lrs[0] * trainer.lr_scheduler.lr_lambdas[0](step)


def test_every_recipe_has_training_defaults_for_every_size():
    for name, recipe in all_recipes().items():
        assert set(recipe.training_defaults) == set(recipe.sizes), name
        for size, defaults in recipe.training_defaults.items():
            assert defaults.size in recipe.sizes and defaults.warmup_steps < defaults.total_steps, (name, size)
            if size in ("base", "large"):
                assert defaults.size == size, (name, size)  # the paper sizes carry their own values


def test_spanbert_adamw_eps_1e8_linear_schedule_and_decay_on_every_parameter(tmp_path):
    _, training_args, trainer = built(tmp_path, "--model", "spanbert", "--model_size", "base", "--max_steps", "2400000")
    optimizer = trainer.optimizer
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.defaults["betas"] == (0.9, 0.999) and optimizer.defaults["eps"] == 1e-8
    assert optimizer.defaults["lr"] == 1e-4
    # The authors' fairseq Adam decays every parameter (0.01, not the paper's 0.1): biases and LayerNorm included.
    decayed, exempt = optimizer.param_groups
    assert decayed["weight_decay"] == 0.01 and not exempt["params"]
    assert len(decayed["params"]) == len(list(trainer.model.parameters()))
    assert training_args.max_grad_norm == 1.0
    # 10k warmup steps, then linear decay to 0 at 2.4M.
    assert lr_at(trainer, 0) == 0 and lr_at(trainer, 5_000) == pytest.approx(0.5e-4)
    assert lr_at(trainer, 10_000) == pytest.approx(1e-4)
    assert lr_at(trainer, 10_000 + 1_195_000) == pytest.approx(0.5e-4)
    assert lr_at(trainer, 2_400_000) == 0
    # Batch 256 x 512: 32 per device x 8 accumulated steps on one process.
    assert (training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps) == (32, 8)


@pytest.mark.parametrize("model, size, lr, total", [("teams", "small", 5e-4, 500_000),
                                                     ("teams", "base", 2e-4, 1_000_000),
                                                     ("electra", "small", 5e-4, 1_000_000)])
def test_teams_and_electra_adamw_eps_1e6_decay_spares_layernorm_and_biases(tmp_path, model, size, lr, total):
    args, training_args, trainer = built(tmp_path, "--model", model, "--model_size", size, "--max_steps", str(total))
    optimizer = trainer.optimizer
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.defaults["betas"] == (0.9, 0.999) and optimizer.defaults["eps"] == 1e-6
    assert lr_at(trainer, 10_000) == pytest.approx(lr) and lr_at(trainer, 5_000) == pytest.approx(lr / 2)
    assert lr_at(trainer, total) == 0 and training_args.max_grad_norm == 1.0
    # Exempt from decay exactly what the authors' TF code exempts ("LayerNorm", "layer_norm", "bias").
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    layer_norms = {f"{module_name}.{n}" for module_name, module in trainer.model.named_modules()
                   if isinstance(module, nn.LayerNorm) for n, _ in module.named_parameters()}
    expected_exempt = {n for n in names.values() if n in layer_norms or "bias" in n.split(".")[-1]}
    decayed, exempt = optimizer.param_groups
    assert decayed["weight_decay"] == 0.01 and exempt["weight_decay"] == 0.0
    assert {names[id(p)] for p in exempt["params"]} == expected_exempt and len(expected_exempt) > 10
    assert not any("norm" in names[id(p)].lower() or names[id(p)].endswith("bias") for p in decayed["params"])
    batch = {("teams", "small"): 256, ("teams", "base"): 256, ("electra", "small"): 128}[(model, size)]
    assert training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps == batch
    assert args.max_seq_length == (128 if model == "electra" else 512)


def test_electra_large_masks_25_percent(tmp_path):
    args, training_args = parse_args(["--output_dir", str(tmp_path), "--model", "electra", "--model_size", "large"])
    assert args.mlm_probability == 0.25 and training_args.learning_rate == 2e-4
    assert training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps == 2048


def test_cloze_nesterov_momentum_clipping_and_one_cosine_cycle(tmp_path):
    _, training_args, trainer = built(tmp_path, "--model", "cloze", "--model_size", "base", "--max_steps", "600000")
    optimizer = trainer.optimizer
    assert type(optimizer) is torch.optim.SGD
    assert optimizer.defaults["momentum"] == 0.99 and optimizer.defaults["nesterov"] is True
    assert optimizer.defaults["dampening"] == 0 and all(g["weight_decay"] == 0 for g in optimizer.param_groups)
    assert training_args.max_grad_norm == 0.1  # gradients renormalised above norm 0.1
    # Linear warmup from 1e-7 to 1 over 16k steps, then one cosine cycle down to 1e-4 at 600k.
    assert lr_at(trainer, 0) == pytest.approx(1e-7)
    assert lr_at(trainer, 7_999) == pytest.approx(0.5, rel=1e-3)
    assert lr_at(trainer, 15_999) == pytest.approx(1.0)
    assert lr_at(trainer, 15_999 + 292_000) == pytest.approx(1e-4 + (1 - 1e-4) / 2)
    assert lr_at(trainer, 599_999) == pytest.approx(1e-4)
    assert training_args.gradient_accumulation_steps == 1  # the paper gives no batch size


def test_nesterov_sgd_step_is_the_papers_update(tmp_path):
    """One clipped SGD step built by Trainer from the cloze recipe equals the Nesterov update written out."""
    _, training_args, trainer = built(tmp_path, "--model", "cloze", "--model_size", "tiny", "--max_steps", "100",
                                      "--learning_rate", "0.5", "--warmup_steps", "0",
                                      "--lr_scheduler_type", "constant")
    parameter = next(p for p in trainer.model.parameters() if p.dim() == 2)
    before, velocity = parameter.detach().clone(), torch.zeros_like(parameter)
    for step in range(3):
        gradient = torch.full_like(parameter, 0.01 * (step + 1))
        for p in trainer.model.parameters():
            p.grad = torch.zeros_like(p)
        parameter.grad = gradient.clone()
        trainer.optimizer.step()
        velocity = 0.99 * velocity + gradient
        before = before - 0.5 * (gradient + 0.99 * velocity)
        torch.testing.assert_close(parameter.detach(), before)


def test_short_runs_warm_up_over_the_papers_fraction(tmp_path):
    _, short, trainer = built(tmp_path, "--model", "spanbert", "--model_size", "small", "--max_steps", "1200")
    assert short.get_warmup_steps(1200) == 5  # ceil(1200 x 10k / 2.4M)
    assert lr_at(trainer, 5) == pytest.approx(1e-4) and lr_at(trainer, 2) == pytest.approx(0.4e-4)
    _, epochs = parse_args(["--output_dir", str(tmp_path), "--model", "teams", "--model_size", "small"])
    assert epochs.warmup_steps == pytest.approx(10_000 / 500_000)  # a ratio of whatever the epochs add up to
    _, long = parse_args(["--output_dir", str(tmp_path), "--model", "teams", "--model_size", "small",
                          "--max_steps", "900000"])
    assert long.warmup_steps == 10_000


def test_tiny_takes_the_papers_optimiser_at_its_own_rate_and_warmup(tmp_path):
    """No paper trains `tiny`: it keeps each recipe's optimiser (AdamW, decay, clipping) at 1e-3 warmed up over 5%."""
    args, tiny, trainer = built(tmp_path, "--model", "spanbert", "--model_size", "tiny", "--max_steps", "1200")
    assert tiny.get_warmup_steps(1200) == 60 and args.max_seq_length == 128
    assert lr_at(trainer, 60) == pytest.approx(1e-3) and lr_at(trainer, 30) == pytest.approx(0.5e-3)
    assert (tiny.weight_decay, tiny.adam_epsilon) == (0.01, 1e-8)  # SpanBERT's, as base
    for recipe in ("teams", "electra"):
        defaults = get_recipe(recipe).training_defaults["tiny"]
        small = get_recipe(recipe).training_defaults["small"]
        assert (defaults.learning_rate, defaults.warmup_for(4_000), defaults.batch_size) == (1e-3, 200, None)
        assert (defaults.adam_epsilon, defaults.weight_decay, defaults.optim) == (small.adam_epsilon,
                                                                                  small.weight_decay, small.optim)
    assert get_recipe("cloze").training_defaults["tiny"] is get_recipe("cloze").training_defaults["base"]  # SGD


def test_global_batch_follows_per_device_batch_and_processes(tmp_path):
    base = ["--output_dir", str(tmp_path), "--model", "spanbert", "--model_size", "base"]
    assert parse_args([*base, "--per_device_train_batch_size", "64"])[1].gradient_accumulation_steps == 4
    assert parse_args([*base, "--gradient_accumulation_steps", "3"])[1].gradient_accumulation_steps == 3
    # pretrain.py reads the process count from WORLD_SIZE (set by accelerate launch / torchrun).
    flags = get_recipe("spanbert").training_defaults["base"].flags(
        model_size="base", max_steps=-1, per_device_batch_size=32, world_size=4, set_by_user=lambda flag: False)
    assert flags[flags.index("--gradient_accumulation_steps") + 1] == "2"  # 32 x 2 x 4 processes = 256
    # Sizes the paper lacks keep the optimiser but not the 256-sequence batch (smoke runs stay small).
    args, tiny = parse_args(["--output_dir", str(tmp_path), "--model", "spanbert", "--model_size", "tiny",
                             "--max_seq_length", "64"])
    assert tiny.gradient_accumulation_steps == 1 and args.max_seq_length == 64 and tiny.adam_epsilon == 1e-8


def test_every_flag_overrides_the_recipe(tmp_path):
    argv = ["--output_dir", str(tmp_path), "--model", "spanbert", "--model_size", "base", "--max_steps", "3000000",
            "--learning_rate", "3e-4", "--adam_epsilon", "1e-6", "--adam_beta2", "0.98", "--weight_decay", "0.1",
            "--decay_norms_and_biases", "false", "--warmup_steps", "7", "--lr_scheduler_type", "cosine",
            "--max_grad_norm", "0.5", "--max_seq_length", "256", "--gradient_accumulation_steps", "1"]
    args, training_args = parse_args(argv)
    assert (training_args.learning_rate, training_args.adam_epsilon, training_args.adam_beta2) == (3e-4, 1e-6, 0.98)
    assert (training_args.weight_decay, args.decay_norms_and_biases, training_args.warmup_steps) == (0.1, False, 7)
    assert training_args.lr_scheduler_type == "cosine" and training_args.max_grad_norm == 0.5
    assert args.max_seq_length == 256 and training_args.gradient_accumulation_steps == 1
    _, _, trainer = built(tmp_path, "--model", "cloze", "--model_size", "tiny", "--max_steps", "100",
                          "--optim", "adamw_torch", "--learning_rate", "1e-3", "--lr_scheduler_type", "linear",
                          "--lr_scheduler_kwargs", "{}", "--max_grad_norm", "1.0")
    assert type(trainer.optimizer) is torch.optim.AdamW and trainer.optimizer.defaults["lr"] == 1e-3
    decayed, exempt = trainer.optimizer.param_groups
    assert exempt["params"]  # the default exemptions are back without the SpanBERT recipe's flag


def test_unknown_size_is_named(tmp_path):
    with pytest.raises(ValueError,
                       match="--model_size 'huge' is not a teams preset; choose from tiny, small, base, large"):
        parse_args(["--output_dir", str(tmp_path), "--model", "teams", "--model_size", "huge"])


def test_help_lists_each_recipes_paper_defaults():
    text = recipe_defaults_help()
    assert ("teams small: AdamW (betas 0.9, 0.999; eps 1e-06), lr 0.0005, warmup 10000 of 500000 updates "
            "(2.00%)" in text)
    assert ("teams tiny: AdamW (betas 0.9, 0.999; eps 1e-06), lr 0.001, warmup 200 of 4000 updates (5.00%)" in text
            and "[ours for the tiny size" in text)
    assert ("cloze tiny/small/base/cnn_tiny/cnn_base: SGD (Nesterov momentum 0.99), lr 1, warmup 16000 of 600000 "
            "updates (2.67%), from 1e-07 x lr, cosine decay to 0.0001, weight decay 0, clip 0.1" in text)
    assert "spanbert small/base/large: AdamW (betas 0.9, 0.999; eps 1e-08), lr 0.0001" in text
    assert "weight decay 0.01 on every parameter" in text and "electra large:" in text and "masking 25%" in text


def test_card_shows_what_the_run_used_next_to_the_paper(tmp_path):
    _, _, trainer = built(tmp_path, "--model", "cloze", "--model_size", "base", "--max_steps", "600",
                          "--optim", "adamw_torch", "--learning_rate", "3e-4", "--lr_scheduler_type", "linear",
                          "--lr_scheduler_kwargs", "{}", "--per_device_train_batch_size", "4")
    rows = optimisation_comparison(trainer, get_recipe("cloze").training_defaults["base"], max_seq_length=128)
    assert rows["optimizer"] == ("AdamW (betas 0.9, 0.999; eps 1e-08)", "SGD (Nesterov momentum 0.99)")
    assert rows["peak learning rate"] == ("0.0003", "1")
    assert rows["warmup"] == ("16 of 600 updates (2.67%)", "16000 of 600000 updates (2.67%), from 1e-07 x lr")
    assert rows["decay"] == ("linear decay to 0", "cosine decay to 0.0001")
    assert rows["gradient clipping"] == ("global norm 0.1", "global norm 0.1")
    assert rows["batch (sequences per update)"] == ("4", "not stated")
    assert rows["sequence length"] == ("128", "512") and rows["weight decay"] == ("none", "none")
    meta = CardMetadata(model_name="cloze", summary="s", auto_map={}, optimisation=rows,
                        optimisation_source="the source")
    text = write_card(meta, tmp_path).read_text()
    assert "| setting | this run | paper |" in text and "| peak learning rate | 0.0003 | 1 |" in text
    assert "(the source)" in text


def test_card_names_our_tiny_recipe_as_ours_not_the_papers(tmp_path):
    teams = get_recipe("teams").training_defaults
    assert teams["tiny"].reference == "tiny recipe" and teams["small"].reference == "paper"
    # cloze's tiny size trains with the paper's own recipe, and its card says so
    assert get_recipe("cloze").training_defaults["tiny"].reference == "paper"
    meta = CardMetadata(model_name="teams-tiny", summary="s", auto_map={}, optimisation={"peak learning rate": (
        "0.001", "0.001")}, optimisation_reference=teams["tiny"].reference, optimisation_source=teams["tiny"].source)
    text = write_card(meta, tmp_path).read_text()
    assert "| setting | this run | tiny recipe |" in text and "| setting | this run | paper |" not in text
    assert "next to the tiny recipe's (ours for the tiny size" in text


def test_card_weight_decay_row_reads_the_decay_groups(tmp_path):
    _, _, trainer = built(tmp_path, "--model", "teams", "--model_size", "small", "--max_steps", "1000")
    rows = optimisation_comparison(trainer, get_recipe("teams").training_defaults["small"], 512, 0.15)
    assert rows["weight decay"] == ("0.01, biases and LayerNorm exempt", "0.01, biases and LayerNorm exempt")
    assert rows["masking rate"] == ("15%", "15%") and rows["updates"] == ("0", "500000")
    assert math.isclose(float(rows["peak learning rate"][0]), 5e-4)


def bertac_cnn_flags(world_size, *set_by_user):
    defaults = get_recipe("bertac_cnn").training_defaults["w123-f100"]
    return defaults.flags(model_size="w123-f100", max_steps=-1, per_device_batch_size=32, world_size=world_size,
                          set_by_user=lambda flag: flag in set_by_user)


def test_bertac_cnn_splits_the_papers_4000_pairs_over_the_processes(tmp_path):
    """The paper's batch is 4,000 pairs in all: N processes train with 4000 / N each, never 4000 x N."""
    for world_size, per_device in ((1, "4000"), (2, "2000"), (8, "500")):
        flags = bertac_cnn_flags(world_size)
        assert flags[flags.index("--per_device_train_batch_size") + 1] == per_device
        assert "--gradient_accumulation_steps" not in flags  # the GAN's two updates per batch cannot accumulate
    with pytest.raises(ValueError, match=r"batch of 4000 in all does not split evenly over 3 processes.*"
                                         r"--num_processes N.*--per_device_train_batch_size"):
        bertac_cnn_flags(3)
    assert "--per_device_train_batch_size" not in bertac_cnn_flags(3, "--per_device_train_batch_size")  # the user's
    _, training_args = parse_args(["--output_dir", str(tmp_path), "--model", "bertac_cnn"])  # one process
    assert (training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps) == (4000, 1)
    from types import SimpleNamespace

    from encoder_zoo.training.recipes.bertac import batch_text

    assert batch_text(SimpleNamespace(per_device_train_batch_size=2000, world_size=2)).startswith(
        "4000 pairs in all (2000 per process x 2 processes)")  # the card's row


def test_bertac_cnn_rmsprop_spells_out_torchs_settings_in_the_optimizer_help_and_card(tmp_path):
    """The paper names RMSProp at 2e-4 only; the authors trained in PyTorch, so torch's RMSprop settings, written
    out."""
    from encoder_zoo.models.bertac.configuration_bertac import BertacCnnConfig
    from encoder_zoo.models.bertac.modeling_bertac import BertacCnnForPreTraining
    from encoder_zoo.training.recipes.bertac import BERTAC_CNN_SIZES
    from encoder_zoo.training.run.trainer import GanTrainer

    _, training_args = parse_args(["--output_dir", str(tmp_path), "--model", "bertac_cnn", "--model_size", "tiny",
                                   "--max_steps", "10"])
    model = BertacCnnForPreTraining(BertacCnnConfig(**BERTAC_CNN_SIZES["tiny"], vocab_size=50, mask_token_id=2))
    trainer = GanTrainer(model=model, args=training_args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    optimizer = trainer.optimizer
    assert type(optimizer) is torch.optim.RMSprop
    assert {key: optimizer.defaults[key] for key in ("lr", "alpha", "eps", "momentum", "centered")} == \
        {"lr": 2e-4, "alpha": 0.99, "eps": 1e-8, "momentum": 0.0, "centered": False}
    assert all(group["weight_decay"] == 0 for group in optimizer.param_groups) and training_args.max_grad_norm == 0
    described = "RMSprop (alpha 0.99; eps 1e-08; momentum 0; not centered)"
    assert f": {described}, lr 0.0002, warmup 0 of 216800 updates" in recipe_defaults_help()
    rows = optimisation_comparison(trainer, get_recipe("bertac_cnn").training_defaults["w123-f100"], 128)
    assert rows["optimizer"] == (described, described)


def test_help_and_log_give_the_warmup_steps_of_a_short_run(tmp_path, caplog):
    """At one --max_steps, each recipe keeps its own paper's warmup fraction: --help says so with the steps, and
    the run logs the steps it warms up for."""
    text = recipe_defaults_help()
    assert ("at --max_steps 10000 the warmup steps are teams small 200, electra small 100, spanbert base 42, "
            "cloze base 267" in text)
    for model, steps in (("teams", 200), ("electra", 100)):
        _, training_args = parse_args(["--output_dir", str(tmp_path), "--model", model, "--model_size", "small",
                                       "--max_steps", "10000"])
        assert training_args.get_warmup_steps(10_000) == steps
    with caplog.at_level("INFO", logger="encoder_zoo.training.run.trainer"):
        built(tmp_path, "--model", "teams", "--model_size", "tiny", "--max_steps", "2000")
    assert "Learning-rate warmup: 100 of 2000 updates (--warmup_steps 0.05)" in caplog.text


def test_a_recipe_module_is_found_not_listed(tmp_path, monkeypatch):
    """A module beside the family recipes that defines RECIPES adds its `--model`s, with no list to edit; a name
    defined twice is refused."""
    import sys

    import encoder_zoo.training.recipes as package
    from encoder_zoo.training.recipes.registry import all_recipes, get_recipe, recipe_modules

    (tmp_path / "toy_family.py").write_text(
        "from dataclasses import replace\n"
        "from encoder_zoo.training.recipes.spanbert import RECIPES as SPANBERT\n"
        "RECIPES = {'toy': replace(SPANBERT['bert'], name='toy')}\n")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "encoder_zoo.training.recipes.toy_family", raising=False)
    assert "encoder_zoo.training.recipes.toy_family" in recipe_modules()
    assert get_recipe("toy").family == "spanbert" and {"spanbert", "teams", "cloze", "bertac_cnn"} <= set(all_recipes())

    (tmp_path / "toy_family.py").write_text(
        "from encoder_zoo.training.recipes.spanbert import RECIPES as SPANBERT\nRECIPES = {'bert': SPANBERT['bert']}\n")
    monkeypatch.delitem(sys.modules, "encoder_zoo.training.recipes.toy_family")
    with pytest.raises(ValueError, match="'bert' is defined twice"):
        all_recipes()
