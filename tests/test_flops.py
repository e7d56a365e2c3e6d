"""Pretraining runs record their compute: trainer_state.json's `total_flos` is the sum, over the batches the run trained
on, of the family's model FLOPs (its `Family.flops` on `training/run/flops.py`'s formulas; bench_gpu.py's count), or
of Trainer's own estimate where that count does not apply; `num_input_tokens_seen` is the number of real
(non-padding) tokens trained on."""

import json
import logging
import signal

import pytest
import torch

from encoder_zoo import models
from encoder_zoo.training.recipes import pretraining_kind, train_step_flops
from encoder_zoo.training.run.trainer import PretrainingTrainer

TINY = ["--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "60", "--tokenizer_vocab_size", "500",
        "--validation_documents", "0", "--dataloader_num_workers", "0", "--logging_steps", "1",
        "--disable_tqdm", "true", "--per_device_train_batch_size", "4", "--max_steps", "3", "--save_steps", "3"]


@pytest.fixture
def trained_batches(monkeypatch):
    """Every training batch the model is called on, copied before its forward (which may sample in place)."""
    seen = []
    compute_loss = PretrainingTrainer.compute_loss

    def recording(self, model, inputs, *args, **kwargs):
        if model.training:
            seen.append({key: value.clone() if torch.is_tensor(value) else value for key, value in inputs.items()})
        return compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(PretrainingTrainer, "compute_loss", recording)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}  # SaveOnSignal's handlers
    yield seen
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def run(tmp_path, model, *extra):
    """A 3-step tiny pretraining run in this process: its trainer_state.json, the model it trained (rebuilt from the
    export's config) and its card."""
    from encoder_zoo.training.pretrain import main

    out = tmp_path / "run"
    export = main(["--model", model, *TINY, *extra, "--output_dir", str(out)])
    state = json.loads((out / "trainer_state.json").read_text())
    config = json.loads((export / "config.json").read_text())
    config_class = models.get_class(config["model_type"], "AutoConfig")
    built = models.get_class(config["model_type"], "AutoModelForPreTraining")(config_class.from_pretrained(export))
    return state, built, (export / "README.md").read_text()


def real_tokens(batch) -> int:
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()


def trainer_estimate(model, batches) -> int:
    """transformers' Trainer.floating_point_ops: 6 x non-embedding parameters x input ids (padding included)."""
    return sum(6 * batch["input_ids"].numel() * model.num_parameters(exclude_embeddings=True) for batch in batches)


@pytest.mark.parametrize("model, kind, extra", [
    ("spanbert", "spanbert", ["--packing", "true"]),  # packed rows: cu_seq_lens_q, span boundaries shifted per example
    ("teams", "teams", []),
    ("cloze", "cloze", []),
])
def test_total_flos_is_the_model_flop_count_of_the_batches_trained_on(tmp_path, trained_batches, caplog, model, kind,
                                                                       extra):
    caplog.set_level(logging.INFO, logger="encoder_zoo.training.run.trainer")
    state, built, card = run(tmp_path, model, *extra)
    assert len(trained_batches) == state["global_step"] == 3
    assert ("cu_seq_lens_q" in trained_batches[0]) == bool(extra)
    expected = sum(train_step_flops(kind, built, batch) for batch in trained_batches)
    assert state["total_flos"] == expected > 0
    assert expected != trainer_estimate(built, trained_batches)  # the hook, not Trainer's estimate, made total_flos
    assert state["num_input_tokens_seen"] == sum(real_tokens(batch) for batch in trained_batches)
    assert f"counted as {kind!r}" in caplog.text
    assert f"| compute | {expected:.3g} FLOPs (model FLOPs, counted as '{kind}'), " in card


def test_a_model_the_count_does_not_cover_gets_trainers_estimate(tmp_path, trained_batches, caplog):
    caplog.set_level(logging.INFO, logger="encoder_zoo.training.run.trainer")
    state, built, _ = run(tmp_path, "cloze", "--config_overrides", "loss_type=bilm")
    with pytest.raises(ValueError, match="bilm"):
        train_step_flops("cloze", built, trained_batches[0])
    assert state["total_flos"] == trainer_estimate(built, trained_batches) > 0
    assert state["num_input_tokens_seen"] == sum(real_tokens(batch) for batch in trained_batches)
    assert "total_flos: Trainer's estimate" in caplog.text and "not 'bilm'" in caplog.text


@pytest.mark.parametrize("model, overrides, kind", [
    ("spanbert", {}, "spanbert"),
    ("bert", {}, "bert"),
    ("bert_2seq_nsp", {}, "bert"),
    ("teams", {}, "teams"),
    ("electra", {}, "electra"),
    ("cloze", {}, "cloze"),
    ("cloze", {"loss_type": "bilm"}, "cloze"),  # then train_step_flops raises: Trainer's estimate
])
def test_each_recipe_gets_its_kind(model, overrides, kind):
    from encoder_zoo.training.recipes import get_recipe

    recipe = get_recipe(model)
    config = models.get_class(recipe.family, "AutoConfig")(**recipe.sizes["tiny"], **recipe.config_overrides,
                                                           **overrides)
    built = models.get_class(recipe.family, "AutoModelForPreTraining")(config)
    inputs = {"input_ids": torch.ones(1, 4, dtype=torch.long), "labels": torch.ones(1, 4, dtype=torch.long)}
    if recipe.default_masking_scheme == "span":
        inputs.update(span_left=torch.full((1, 4), -1), span_right=torch.full((1, 4), -1))
    assert pretraining_kind(built, inputs) == kind
    assert pretraining_kind(built, {"input_ids": inputs["input_ids"]}) is None  # no labels: nothing to count
