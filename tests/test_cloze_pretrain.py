"""The cloze model on the pretraining spine: paragraph examples with boundary markers, the every-token collator,
`training/pretrain.py --model cloze` end to end (export, fresh-process reload, loss down on real text), and
fine-tuning a cloze pretraining export through the GLUE and QA harnesses."""

import json

import datasets
import pytest
import torch
from helpers import run_isolated
from test_pretrain import pretrain, real_text_run, train_logs
from transformers import AutoTokenizer

from encoder_zoo.training.data.resources import minilm_path
from encoder_zoo.training.recipes.cloze import ClozeCollator, paragraph_examples


class Args:
    max_seq_length = 16
    preprocessing_num_workers = None


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_path())


def test_paragraph_examples_are_marked_and_lose_nothing(tokenizer):
    long_paragraph = " ".join(f"word{i}" for i in range(40))
    corpus = datasets.Dataset.from_dict({"text": [f"First paragraph here.\n\nSecond one.\n{long_paragraph}", ""]})
    examples = paragraph_examples(corpus, tokenizer, Args())["input_ids"]
    assert all(e[0] == tokenizer.cls_token_id and e[-1] == tokenizer.sep_token_id for e in examples)
    assert all(len(e) <= Args.max_seq_length for e in examples)
    assert tokenizer.decode(examples[0][1:-1]) == "first paragraph here."
    assert tokenizer.decode(examples[1][1:-1]) == "second one."
    # The long paragraph continues over several examples; concatenated, they are the whole paragraph.
    rest = [piece for e in examples[2:] for piece in e[1:-1]]
    assert rest == tokenizer(long_paragraph, add_special_tokens=False)["input_ids"] and len(examples) > 3


def test_collator_targets_every_real_token_but_the_leading_marker(tokenizer):
    collator = ClozeCollator(tokenizer)
    batch = collator([{"input_ids": [101, 7, 8, 9, 102]}, {"input_ids": [101, 5, 102]}])
    assert batch["input_ids"].shape == (2, 8)  # padded to a multiple of 8
    assert batch["attention_mask"].tolist() == [[1] * 5 + [0] * 3, [1] * 3 + [0] * 5]
    assert batch["labels"].tolist() == [[-100, 7, 8, 9, 102, -100, -100, -100], [-100, 5, 102] + [-100] * 5]


def test_pretrain_cloze_exports_and_reloads_without_this_repository(tmp_path):
    out = tmp_path / "run"
    pretrain("--model", "cloze", "--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "300",
             "--tokenizer_vocab_size", "2000", "--per_device_train_batch_size", "8", "--validation_documents", "20",
             "--dataloader_num_workers", "0", "--output_dir", str(out), "--max_steps", "8", "--logging_steps", "4")
    logs = train_logs(out / "checkpoint-8" / "trainer_state.json")
    assert {"cloze_loss", "cloze_ppl", "tokens_per_second"} <= set(logs[-1])
    export = out / "export"
    config = json.loads((export / "config.json").read_text())
    assert config["model_type"] == "cloze" and config["auto_map"]["AutoModel"] == "modeling_cloze.TwoTowerClozeModel"
    tokenizer = AutoTokenizer.from_pretrained(export)
    assert (config["bos_token_id"], config["sep_token_id"]) == (tokenizer.cls_token_id, tokenizer.sep_token_id)
    assert "Cloze-driven Pretraining" in (export / "README.md").read_text()
    result = json.loads(run_isolated(f"""
        import json, torch
        from transformers import AutoModel, AutoModelForPreTraining, AutoTokenizer
        path = {str(export)!r}
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        model = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
        full = AutoModelForPreTraining.from_pretrained(path, trust_remote_code=True).eval()
        batch = tokenizer(["The river flows into the sea."], return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
            out = full(**batch, labels=batch["input_ids"])
        print(json.dumps({{"class": type(model).__module__ + "." + type(model).__name__, "shape": list(hidden.shape),
                           "loss": out.loss.item()}}))
    """).strip().splitlines()[-1])
    assert result["class"].startswith("transformers_modules") and result["class"].endswith("TwoTowerClozeModel")
    assert result["shape"][-1] == 128 and 0 < result["loss"] < 20


def test_masking_options_are_refused_for_the_cloze_model(tmp_path):
    result = pretrain("--model", "cloze", "--masking_scheme", "span", "--output_dir", str(tmp_path / "x"), check=False)
    assert result.returncode == 2 and "masks nothing" in result.stderr


@pytest.mark.slow
def test_cloze_loss_goes_down_on_real_text(tmp_path):
    # The paper's optimiser (Nesterov momentum 0.99, peak lr 1, clipping at 0.1, cosine to 1e-4), compressed to 150
    # steps: it reaches about the unigram level (6.75 nats), 1.15 nats below the first logged mean.
    state = real_text_run("cloze", tmp_path / "run", steps=150, logging_steps=15, learning_rate=None)
    logs = train_logs(state)
    first, last = logs[0]["cloze_loss"], sum(entry["cloze_loss"] for entry in logs[-3:]) / 3
    # From ~ln(4000) = 8.3 nats: more than 1 nat lower (perplexity down by over 60%), every token a target.
    assert last < first - 1.0, (first, last)
    history = json.loads(state.read_text())["log_history"]
    assert [e["eval_loss"] for e in history if "eval_loss" in e][-1] < first - 1.0


@pytest.mark.slow
def test_character_cnn_cloze_learns_real_text_and_its_export_spells_the_word_vocabulary(tmp_path):
    state = real_text_run("cloze", tmp_path / "run", steps=150, logging_steps=15, learning_rate=None,
                          model_size="cnn_tiny")
    logs = train_logs(state)
    first, last = logs[0]["cloze_loss"], sum(entry["cloze_loss"] for entry in logs[-3:]) / 3
    # From ~ln(4000) = 8.3 nats over a 4,000-word vocabulary (rarer words are [UNK], a frequent target).
    assert last < first - 1.5, (first, last)
    export = tmp_path / "run" / "export"
    assert json.loads((export / "tokenizer.json").read_text())["model"]["type"] == "WordLevel"
    config = json.loads((export / "config.json").read_text())
    assert config["input_representation"] == "char_cnn" and config["use_adaptive_softmax"]
    words = AutoTokenizer.from_pretrained(export).convert_ids_to_tokens(list(range(config["vocab_size"])))
    result = json.loads(run_isolated(f"""
        import json, torch
        from transformers import AutoModelForPreTraining, AutoTokenizer
        path = {str(export)!r}
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        model = AutoModelForPreTraining.from_pretrained(path, trust_remote_code=True).eval()
        table = model.cloze.embeddings.character_cnn.word_characters
        spelled = [bytes(b - 1 for b in row if b).decode("utf-8", "replace") for row in table.tolist()]
        batch = tokenizer(["The river flows into the sea ."], return_tensors="pt")
        with torch.no_grad():
            loss = model(**batch, labels=batch["input_ids"]).loss.item()
        print(json.dumps({{"spelled": spelled, "loss": loss}}))
    """).strip().splitlines()[-1])
    # cnn_tiny reads the first 20 bytes of a word.
    assert result["spelled"] == [word.encode()[:20].decode("utf-8", "replace") for word in words]
    assert 0 < result["loss"] < first


@pytest.mark.slow
def test_a_cloze_pretraining_checkpoint_fine_tunes_through_glue_and_qa(tmp_path, tokenizer):
    from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification

    from encoder_zoo.glue.run_glue import main as run_glue
    from encoder_zoo.models.cloze.configuration_cloze import TwoTowerClozeConfig
    from encoder_zoo.models.cloze.modeling_cloze import TwoTowerCloze
    from encoder_zoo.qa.run_qa import main as run_qa

    torch.manual_seed(0)
    checkpoint = tmp_path / "cloze"
    config = TwoTowerClozeConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=128, bos_token_id=tokenizer.cls_token_id,
                                 eos_token_id=tokenizer.sep_token_id, sep_token_id=tokenizer.sep_token_id)
    TwoTowerCloze(config).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    glue = run_glue(["--model_name_or_path", str(checkpoint), "--trust_remote_code", "--task_name", "rotten_tomatoes",
                     "--max_train_samples", "32", "--max_eval_samples", "16", "--max_seq_length", "64",
                     "--preset", "cloze", "--num_train_epochs", "1", "--per_device_train_batch_size", "8",
                     "--output_dir", str(tmp_path / "glue")])
    assert 0 <= glue["tasks"]["rotten_tomatoes"]["median"]["accuracy"] <= 100
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "glue" / "rotten_tomatoes" / "seed-42",
                                                                    trust_remote_code=True)
    assert type(classifier).__name__ == "TwoTowerClozeForSequenceClassification"
    qa = run_qa(["--model_name_or_path", str(checkpoint), "--trust_remote_code", "--dataset", "wiki_cloze",
                 "--max_train_samples", "24", "--max_eval_samples", "12", "--max_seq_length", "128",
                 "--doc_stride", "32", "--max_question_length", "48", "--num_train_epochs", "1",
                 "--per_device_train_batch_size", "8", "--output_dir", str(tmp_path / "qa")])
    assert "f1" in qa["eval"]
    assert (type(AutoModelForQuestionAnswering.from_pretrained(tmp_path / "qa", trust_remote_code=True)).__name__
            == "TwoTowerClozeForQuestionAnswering")
