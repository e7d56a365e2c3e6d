"""`pretrain.py --init_from`: a run started from published weights. At step 0 the model is the checkpoint's (BERT into
SpanBERT, an ELECTRA pair into ELECTRA: the same outputs as transformers' classes), every parameter is listed as
loaded or new, a bad start is refused before anything is written, a killed run resumes bitwise, and a short
continued pretraining of the shipped MiniLM lowers its held-out loss, exports, reloads and fine-tunes.

The checkpoints are tiny ones made here with transformers' own classes (MiniLM's vocabulary); no network."""

from __future__ import annotations

import json
import signal

import pytest
import torch
import transformers
from helpers import call_cli, card_without_time, pretrain, run_isolated, save_tiny_spanbert
from test_resume import assert_same_weights, start, step_logs, wait_for

from encoder_zoo import models
from encoder_zoo.training import pretrain as pretrain_module
from encoder_zoo.training.data.resources import HUB_ORIGINS, minilm_path
from encoder_zoo.training.run.init_from import RECORD, apply

MINILM_HUB_ID = HUB_ORIGINS["minilm"][0]
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=128)


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def bert_checkpoint(tmp_path_factory, tokenizer):
    """A tiny `BertForPreTraining` (MLM and NSP heads) with MiniLM's tokenizer."""
    folder = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    transformers.BertForPreTraining(transformers.BertConfig(vocab_size=len(tokenizer), **TINY)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def electra_pair(tmp_path_factory, tokenizer):
    """A tiny ELECTRA discriminator and its narrower generator, sharing the embeddings as Google's release does."""
    folder = tmp_path_factory.mktemp("electra")
    torch.manual_seed(0)
    discriminator = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        vocab_size=len(tokenizer), embedding_size=16, **TINY))
    generator = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        vocab_size=len(tokenizer), embedding_size=16, **{**TINY, "hidden_size": 8, "num_attention_heads": 1,
                                                         "intermediate_size": 16}))
    generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())
    discriminator.save_pretrained(folder / "discriminator")
    generator.save_pretrained(folder / "generator")
    tokenizer.save_pretrained(folder / "discriminator")
    return folder / "discriminator", folder / "generator"


def started_model(tmp_path, *flags):
    """The model `pretrain.py` would train at step 0 with `flags`, built as its main() builds it (no corpus read)."""
    args, _ = pretrain_module.parse_args([*flags, "--output_dir", str(tmp_path / "run")])
    recipe, overrides = pretrain_module.check_recipe_arguments(args)
    config = models.get_class(recipe.family, "AutoConfig")(**pretrain_module.config_arguments(recipe, args, overrides))
    model = models.get_class(recipe.family, "AutoModelForPreTraining")(config)
    apply(model, args.init_plan)
    return model.eval(), args.init_plan


def sentences(tokenizer):
    return tokenizer(["The cat sat on the mat.", "Rome was the capital of an empire that ruled the Mediterranean."],
                     padding=True, return_tensors="pt")


@pytest.mark.parametrize("recipe", ["spanbert", "bert"])
def test_spanbert_and_bert_from_a_bert_checkpoint_are_that_bert_at_step_0(tmp_path, bert_checkpoint, tokenizer,
                                                                          recipe):
    model, init = started_model(tmp_path, "--model", recipe, "--init_from", str(bert_checkpoint))
    reference = transformers.BertForPreTraining.from_pretrained(bert_checkpoint).eval()
    inputs = sentences(tokenizer)
    with torch.no_grad():
        ours, theirs = model.spanbert(**inputs).last_hidden_state, reference.bert(**inputs).last_hidden_state
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.cls.predictions(ours), reference.cls.predictions(theirs), atol=1e-5, rtol=0)
    # Every parameter is loaded or new; the SBO head is new, NSP's head and the pooler are named as not used.
    assert set(init.loads) | set(init.new) == {name for name, _ in model.named_parameters()}
    assert all(name.startswith("sbo.") for name in init.new) and (recipe == "bert") == (not init.new)
    assert {key for _, key in init.unused} == {"bert.pooler.dense.weight", "bert.pooler.dense.bias",
                                               "cls.seq_relationship.weight", "cls.seq_relationship.bias"}
    assert "| `spanbert.embeddings.*` | 5 | loaded from --init_from `bert.embeddings.*` |" in init.table()


def test_electra_from_an_electra_pair_is_that_pair_at_step_0(tmp_path, electra_pair, tokenizer):
    discriminator, generator = electra_pair
    model, init = started_model(tmp_path, "--model", "electra", "--init_from", str(discriminator),
                                "--init_generator_from", str(generator))
    # The generator's own copy of the shared embeddings is not read: counted and named, with the note saying why.
    assert not init.new and {key for _, key in init.unused} == {
        f"electra.embeddings.{part}" for part in ("word_embeddings.weight", "position_embeddings.weight",
                                                  "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")}
    assert {flag for flag, _ in init.unused} == {"--init_generator_from"} and "5 checkpoint tensors not used" in (
        init.summary())
    assert "| (--init_generator_from) `electra.embeddings.*` | 5 | in the checkpoint, not used |" in init.table()
    assert any("the --init_generator_from checkpoint's own copy is not read" in note for note in init.notes)
    model.save_pretrained(tmp_path / "saved")
    generator_ours = models.get_class("teams", "AutoModelForMaskedLM").from_pretrained(tmp_path / "saved").eval()
    reference = transformers.ElectraForPreTraining.from_pretrained(discriminator).eval()
    reference_generator = transformers.ElectraForMaskedLM.from_pretrained(generator).eval()
    inputs = sentences(tokenizer)
    with torch.no_grad():
        hidden = model.teams(**inputs).last_hidden_state
        torch.testing.assert_close(hidden, reference.electra(**inputs).last_hidden_state, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.rtd_head(hidden).squeeze(-1), reference(**inputs).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(generator_ours(**inputs).logits, reference_generator(**inputs).logits, atol=1e-5,
                                   rtol=0)


def test_teams_from_electra_copies_the_top_layer_into_its_task_layers_and_starts_the_mws_head_new(
        tmp_path, electra_pair):
    model, init = started_model(tmp_path, "--model", "teams", "--init_from", str(electra_pair[0]))
    assert init.loads["teams.rtd_layer.output.dense.weight"] == ("--init_from", "electra.encoder.layer.1.output.dense."
                                                                 "weight")
    assert torch.equal(model.teams.rtd_layer.output.dense.weight, model.teams.layer[1].output.dense.weight)
    assert {name.split(".")[0] for name in init.new} == {"generator", "mws_head"}  # its MLM head, bias and MWS head
    assert any("MWS head (no counterpart in ELECTRA): new." in note for note in init.notes)


def test_a_zoo_export_continues_name_for_name_with_this_runs_recipe_and_settings(tmp_path):
    """A SpanBERT export (SBO head, saved by a run with --unpad) continued as `bert`: every parameter loads under its
    own name, the SBO head is named as not used, and how the export ran (`unpad`) is not inherited."""
    export = tmp_path / "export"
    save_tiny_spanbert(export, "SpanBertForPreTraining", max_position_embeddings=128)
    config = json.loads((export / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**config, "use_span_boundary_objective": True, "unpad": True}))
    model, init = started_model(tmp_path, "--model", "bert", "--init_from", str(export))
    assert not init.new and all(flag == "--init_from" and key == name for name, (flag, key) in init.loads.items())
    assert {key.split(".")[0] for _, key in init.unused} == {"sbo"}
    assert not model.config.unpad and not model.config.use_span_boundary_objective


def refusal(tmp_path, *flags):
    result = call_cli("encoder_zoo.training.pretrain", *flags, "--output_dir", str(tmp_path / "run"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    run = tmp_path / "run"
    assert not run.exists() or not any(run.iterdir())  # refused before anything is written there
    return result.stderr


def test_a_bad_start_is_refused_clearly_before_anything_is_written(tmp_path, bert_checkpoint, monkeypatch):
    roberta = tmp_path / "roberta"
    transformers.RobertaModel(transformers.RobertaConfig(vocab_size=99, **TINY)).save_pretrained(roberta)
    assert "a roberta checkpoint, which --model spanbert cannot start from. It takes this family's own exports " \
           "(spanbert), bert checkpoints" in refusal(tmp_path, "--model", "spanbert", "--init_from", str(roberta))
    assert "--model_size base disagrees with --init_from" in refusal(
        tmp_path, "--model", "bert", "--model_size", "base", "--init_from", str(bert_checkpoint))
    message = refusal(tmp_path, "--model", "bert", "--init_from", str(bert_checkpoint),
                      "--config_overrides", "intermediate_size=48")
    assert "spanbert.encoder.layer.0.intermediate.dense.weight has [48, 32]" in message.replace("'s ", " ")
    assert "[64, 32]" in message and "--ignore_mismatched_sizes" in message
    assert "longer than the 128 positions" in refusal(tmp_path, "--model", "bert", "--init_from", str(bert_checkpoint),
                                                      "--max_seq_length", "256")
    assert "--init_generator_from applies only with --init_from" in refusal(
        tmp_path, "--model", "electra", "--init_generator_from", str(bert_checkpoint))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    message = refusal(tmp_path, "--model", "bert", "--init_from", "no-such-org/no-such-model")
    assert "HF_HUB_OFFLINE=1" in message and "Pass a local model folder" in message


def test_ignore_mismatched_sizes_starts_those_parameters_new_and_lists_them(tmp_path, bert_checkpoint):
    _, init = started_model(tmp_path, "--model", "bert", "--init_from", str(bert_checkpoint), "--config_overrides",
                            "intermediate_size=48", "--ignore_mismatched_sizes")
    assert set(init.mismatched) == {f"spanbert.encoder.layer.{i}.{part}" for i in range(2) for part in (
        "intermediate.dense.weight", "intermediate.dense.bias", "output.dense.weight")}
    assert set(init.mismatched) <= set(init.new) and "new (shape mismatch ignored)" in init.table()


def test_a_checkpoint_that_is_no_size_preset_keeps_the_nearest_presets_optimiser_not_its_paper_batch(tmp_path):
    """MiniLM (384 wide) is none of TEAMS's presets: the nearest, small, lends its optimiser and schedule, but not
    TEAMS-Small's 256-sequence batch (32 accumulation steps a step) or its 512 tokens."""
    args, training_args = pretrain_module.parse_args(["--model", "teams", "--init_from", minilm_path(),
                                                      "--output_dir", str(tmp_path / "run")])
    assert (args.model_size, args.starting_point.size_matches) == ("small", False)
    assert (training_args.gradient_accumulation_steps, args.max_seq_length) == (1, 128)
    assert (training_args.learning_rate, training_args.adam_epsilon) == (5e-4, 1e-6)  # TEAMS-Small's


@pytest.mark.slow
def test_a_killed_init_from_run_resumes_bitwise_without_reloading_the_starting_weights(tmp_path, bert_checkpoint):
    args = ["--model", "spanbert", "--init_from", str(bert_checkpoint), "--max_seq_length", "64", "--max_documents",
            "40", "--per_device_train_batch_size", "8", "--validation_documents", "4", "--max_steps", "12",
            "--logging_steps", "1", "--save_steps", "6", "--warmup_steps", "2", "--dataloader_num_workers", "0"]
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    pretrain(*args, "--output_dir", str(reference))
    process = start(*args, "--output_dir", str(resumed))
    wait_for(resumed / "checkpoint-6", process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    result = pretrain(*args, "--output_dir", str(resumed), "--resume_from_checkpoint", "true")
    assert "Resuming: the weights come from the checkpoint" in result.stderr
    assert step_logs(resumed, 12) == step_logs(reference, 12)
    assert_same_weights(reference / "export" / "model.safetensors", resumed / "export" / "model.safetensors")
    assert card_without_time(resumed / "export") == card_without_time(reference / "export")  # but wall-clock


@pytest.mark.slow
def test_minilm_continued_with_spanbert_learns_exports_reloads_and_fine_tunes(tmp_path):
    """The shipped MiniLM (a sentence-transformers BertModel: no MLM head) continued for 30 steps of SpanBERT on the
    embedded text: the held-out MLM loss falls below the one evaluated at the start, the card names the Hub origin,
    and the export loads with trust_remote_code in a fresh process and fine-tunes with run_glue."""
    out = tmp_path / "run"
    pretrain("--model", "spanbert", "--init_from", minilm_path(), "--max_documents", "200", "--validation_documents",
             "10", "--max_seq_length", "64", "--max_steps", "30", "--per_device_train_batch_size", "8",
             "--eval_on_start", "true", "--save_steps", "1000", "--learning_rate", "2e-4", "--logging_steps", "10",
             "--output_dir", str(out), timeout=900)
    history = json.loads((out / "export" / "training_log.json").read_text())
    held_out = [entry["eval_mlm_loss"] for entry in history if "eval_mlm_loss" in entry]
    assert held_out[-1] < held_out[0], held_out
    record = json.loads((out / "export" / RECORD).read_text())
    assert record["checkpoints"]["--init_from"]["hub_id"] == MINILM_HUB_ID
    assert all(name.startswith(("cls.", "sbo.")) for name in record["new"])  # the encoder is all MiniLM's
    card = (out / "export" / "README.md").read_text()
    assert f"base_model: {MINILM_HUB_ID}" in card and "## Starting weights" in card
    assert "Continued pretraining, not the paper's run from scratch" in card
    assert "hidden 384" in run_isolated(
        "from transformers import AutoModel\n"
        f"m = AutoModel.from_pretrained({str(out / 'export')!r}, trust_remote_code=True)\n"
        "print('hidden', m.config.hidden_size)")
    glue = call_cli("encoder_zoo.glue.run_glue", "--model_name_or_path", str(out / "export"), "--task_name",
                    "rotten_tomatoes", "--max_train_samples", "64", "--max_eval_samples", "32", "--num_train_epochs",
                    "1", "--per_device_train_batch_size", "16", "--output_dir", str(tmp_path / "glue"),
                    "--trust_remote_code", "--report_to", "none")
    assert glue.returncode == 0, glue.stderr[-3000:]


def save_as_torch_state_dict(model, folder):
    """config.json and pytorch_model.bin as transformers' convert_electra_original_tf_checkpoint_to_pytorch writes
    them (torch.save(model.state_dict()), tied tensors included) beside the release's config.json."""
    folder.mkdir(parents=True)
    model.config.to_json_file(folder / "config.json")
    torch.save(model.state_dict(), folder / "pytorch_model.bin")


def test_electra_from_googles_release_as_transformers_converts_it_is_that_pair_at_step_0(tmp_path, tokenizer):
    torch.manual_seed(0)
    config = dict(vocab_size=len(tokenizer), embedding_size=16, **TINY)
    discriminator = transformers.ElectraForPreTraining(transformers.ElectraConfig(**config)).eval()
    generator = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        **{**config, "hidden_size": 8, "num_attention_heads": 1, "intermediate_size": 16})).eval()
    generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())
    save_as_torch_state_dict(discriminator, tmp_path / "electra-small-discriminator")
    save_as_torch_state_dict(generator, tmp_path / "electra-small-generator")
    tokenizer.save_pretrained(tmp_path / "electra-small-discriminator")
    model, init = started_model(tmp_path, "--model", "electra", "--init_from", str(tmp_path / "electra-small-"
                                "discriminator"), "--init_generator_from", str(tmp_path / "electra-small-generator"))
    assert not init.new
    model.save_pretrained(tmp_path / "saved")
    ours_generator = models.get_class("teams", "AutoModelForMaskedLM").from_pretrained(tmp_path / "saved").eval()
    inputs = sentences(tokenizer)
    with torch.no_grad():
        hidden = model.teams(**inputs).last_hidden_state
        torch.testing.assert_close(hidden, discriminator.electra(**inputs).last_hidden_state, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.rtd_head(hidden).squeeze(-1), discriminator(**inputs).logits, atol=1e-5,
                                   rtol=0)
        torch.testing.assert_close(ours_generator(**inputs).logits, generator(**inputs).logits, atol=1e-5, rtol=0)


def test_teams_from_model_garden_lms_conversion_starts_with_what_it_holds(tmp_path, tokenizer):
    """stefan-it/model-garden-lms's convert_teams_original_tf2_checkpoint_to_pytorch: the discriminator as
    ElectraForPreTraining and the generator as ElectraForMaskedLM, each in a folder of its own, with one config (the
    generator as wide and as deep, its bottom half the discriminator's layers, the embeddings shared); both saved with
    save_pretrained(safe_serialization=False): pytorch_model.bin without the tied output layer."""
    torch.manual_seed(0)
    config = transformers.ElectraConfig(vocab_size=len(tokenizer), embedding_size=32, **TINY)
    discriminator = transformers.ElectraForPreTraining(config).eval()
    generator = transformers.ElectraForMaskedLM(config).eval()
    generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())
    shared = config.num_hidden_layers // 2
    for i in range(shared):
        generator.electra.encoder.layer[i].load_state_dict(discriminator.electra.encoder.layer[i].state_dict())
    for model, folder in ((discriminator, "teams-discriminator"), (generator, "teams-generator")):
        save_as_torch_state_dict(model, tmp_path / folder)
        if isinstance(model, transformers.ElectraForMaskedLM):
            state = torch.load(tmp_path / folder / "pytorch_model.bin")
            state.pop("generator_lm_head.weight")
            torch.save(state, tmp_path / folder / "pytorch_model.bin")
    tokenizer.save_pretrained(tmp_path / "teams-discriminator")
    model, init = started_model(tmp_path, "--model", "teams", "--init_from", str(tmp_path / "teams-discriminator"),
                                "--init_generator_from", str(tmp_path / "teams-generator"))
    assert model.config.generator_num_hidden_layers == config.num_hidden_layers
    assert {name.split(".")[0] for name in init.new} == {"mws_head"}, init.new
    assert init.loads["generator.layer.0.output.dense.weight"] == (
        "--init_generator_from", f"electra.encoder.layer.{shared}.output.dense.weight")
    model.save_pretrained(tmp_path / "saved")
    ours_generator = models.get_class("teams", "AutoModelForMaskedLM").from_pretrained(tmp_path / "saved").eval()
    inputs = sentences(tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(model.teams(**inputs).last_hidden_state,
                                   discriminator.electra(**inputs).last_hidden_state, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours_generator(**inputs).logits, generator(**inputs).logits, atol=1e-5, rtol=0)
