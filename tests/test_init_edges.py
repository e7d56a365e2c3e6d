"""`pretrain.py --init_from` at its edges: a tokenizer of another vocabulary (refused, naming both, or mapped row by
row under --resize_embeddings), a checkpoint whose tokenizer outgrew its embeddings or that has none, damaged or
non-finite weights, and the refusals of flags that cannot run: each is one line, and leaves no output folder. The
load table names every tensor (no two rows under one name) and its notes say only what applies.

Tiny checkpoints made here with transformers' own classes (MiniLM's vocabulary, as in test_init_from); no network."""

from __future__ import annotations

import shutil

import pytest
import test_init_from
import torch
import transformers
from helpers import call_cli, card_without_time
from test_init_from import TINY, started_model

from encoder_zoo.training.data.tokenizer import train_wordpiece_tokenizer

# test_init_from's tiny checkpoints (MiniLM's tokenizer, a BertForPreTraining, an ELECTRA pair)
tokenizer, bert_checkpoint, electra_pair = (test_init_from.tokenizer, test_init_from.bert_checkpoint,
                                            test_init_from.electra_pair)

SENTENCES = ["The cat sat on the mat.", "Rome was the capital of an empire.", "The dog sat on the cat's mat."] * 3


def refused(tmp_path, *flags) -> str:
    """The one line a refused run prints; the run's folder does not exist afterwards."""
    run = tmp_path / "run"
    result = call_cli("encoder_zoo.training.pretrain", *flags, "--output_dir", str(run))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not run.exists(), sorted(p.name for p in run.iterdir())
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    """A WordPiece tokenizer of its own (about 100 tokens): [CLS] is id 2 here, 101 in MiniLM's vocabulary."""
    folder = tmp_path_factory.mktemp("small_tokenizer")
    train_wordpiece_tokenizer(SENTENCES, vocab_size=120, min_frequency=1).save_pretrained(folder)
    return folder


def test_a_tokenizer_of_another_vocabulary_is_refused_naming_both(tmp_path, bert_checkpoint, small_tokenizer):
    line = refused(tmp_path, "--model", "bert", "--init_from", str(bert_checkpoint), "--tokenizer_name",
                   str(small_tokenizer))
    assert f"--tokenizer_name {small_tokenizer} is another vocabulary than --init_from {bert_checkpoint}'s" in line
    assert "[CLS] 2 against 101" in line and "against 30522" in line and "--resize_embeddings" in line


def test_resize_embeddings_maps_each_token_to_the_checkpoints_row_and_lists_the_new_ones(
        tmp_path, bert_checkpoint, small_tokenizer, tokenizer):
    model, init = started_model(tmp_path, "--model", "bert", "--init_from", str(bert_checkpoint), "--tokenizer_name",
                                str(small_tokenizer), "--resize_embeddings")
    small = transformers.AutoTokenizer.from_pretrained(small_tokenizer)
    assert model.config.vocab_size == len(small)
    reference = transformers.BertForPreTraining.from_pretrained(bert_checkpoint).bert.embeddings.word_embeddings.weight
    ours = model.spanbert.embeddings.word_embeddings.weight
    old, new = tokenizer.get_vocab(), small.get_vocab()
    shared = [token for token in new if token in old]
    assert {"[CLS]", "the", "cat"} <= set(shared)
    for token in shared:  # [CLS] is row 2 now, MiniLM's row 101
        assert torch.equal(ours[new[token]], reference[old[token]]), token
    missing = sorted(new[token] for token in new if token not in old)
    assert missing and not any(torch.equal(ours[i], reference[i]) for i in missing)
    assert "spanbert.embeddings.word_embeddings.weight" in init.resized
    assert "(rows by token, --resize_embeddings)" in init.table()
    note = next(note for note in init.notes if note.startswith("--resize_embeddings"))
    assert f"from 30522 to {len(small)} rows; {len(shared)} take the checkpoint's row" in note
    assert f"{len(missing)} are new (id token: {missing[0]} " in note


def test_a_checkpoint_whose_tokenizer_outgrew_its_embeddings_or_has_none_is_refused_before_any_folder(
        tmp_path, tokenizer):
    grown = tmp_path / "grown"
    transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=100, **TINY)).save_pretrained(grown)
    tokenizer.save_pretrained(grown)  # 30522 tokens for 100 rows
    line = refused(tmp_path, "--model", "bert", "--init_from", str(grown))
    assert f"--init_from {grown}: its tokenizer has 30522 tokens, more than its 100 embedding rows" in line
    assert "--resize_embeddings to give the 30422 tokens beyond them new rows" in line
    model, init = started_model(tmp_path, "--model", "bert", "--init_from", str(grown), "--resize_embeddings")
    assert model.config.vocab_size == 30522 and "30422 are new (id token: 100 [UNK]" in init.notes[-1]

    bare = tmp_path / "bare"
    transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=len(tokenizer), **TINY)).save_pretrained(bare)
    line = refused(tmp_path, "--model", "bert", "--init_from", str(bare))
    assert f"--init_from {bare}: {bare} holds no tokenizer" in line and "pass --tokenizer_name" in line
    assert "corpus" not in line
    _, init = started_model(tmp_path, "--model", "bert", "--init_from", str(bare), "--tokenizer_name",
                            tokenizer.name_or_path)  # its vocabulary: size and special ids agree with its config
    assert not init.new or all(name.startswith("cls.") for name in init.new)


@pytest.mark.parametrize("damage", ["empty", "truncated", "nan"])
def test_damaged_or_non_finite_weights_are_one_line_before_any_folder(tmp_path, bert_checkpoint, damage):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(bert_checkpoint, checkpoint)
    weights = checkpoint / "model.safetensors"
    if damage == "nan":
        from safetensors.torch import load_file, save_file

        tensors = load_file(weights)
        tensors["bert.encoder.layer.1.output.dense.weight"][0, 0] = float("nan")
        save_file(tensors, weights, metadata={"format": "pt"})
    else:
        weights.write_bytes(weights.read_bytes()[:0 if damage == "empty" else 5000])
    line = refused(tmp_path, "--model", "spanbert", "--init_from", str(checkpoint))
    assert f"--init_from {checkpoint}: " in line
    if damage == "nan":
        assert "1 of the" in line and "hold NaN/inf (--init_from bert.encoder.layer.1.output.dense.weight)" in line
    else:
        assert f"{weights} is {'empty' if damage == 'empty' else 'truncated or not a safetensors file'}" in line
        assert "SafetensorError" not in line


def test_every_refusal_of_a_flag_leaves_no_folder(tmp_path, bert_checkpoint, small_tokenizer):
    """Checks that once ran after the output folder was made (while reading data, building the collator or the
    model) run before it now."""
    tiny = ["--model_size", "tiny", "--max_steps", "2"]
    cases = [
        (["--model", "teams", *tiny, "--config_overrides", "generator_hidden_size=8"],
         "needs the discriminator's width"),
        (["--model", "cloze", *tiny, "--target_buffer"], "--target_buffer: ClozeCollator makes no masked targets"),
        (["--model", "bert_2seq_nsp", *tiny, "--target_buffer"], "--target_buffer: SegmentPairCollator"),
        (["--model", "bert", *tiny, "--mlm_probability", "1.0"], "--mlm_probability 1: pass a fraction between 0"),
        (["--model", "bert", *tiny, "--max_seq_length", "1024", "--config_overrides", "max_position_embeddings=512"],
         "--max_seq_length 1024 is longer than the model's 512 positions"),
        (["--model", "bert", "--init_from", str(bert_checkpoint), "--max_seq_length", "256"],
         "longer than the 128 positions"),
        (["--model", "bert", "--init_from", str(bert_checkpoint), "--resume_from_checkpoint", "true"],
         "no complete checkpoint-* folder"),
    ]
    for flags, message in cases:
        assert message in refused(tmp_path, *flags), flags


def test_the_load_table_names_every_tensor_and_its_notes_say_only_what_applies(tmp_path, bert_checkpoint,
                                                                              electra_pair):
    _, spanbert = started_model(tmp_path, "--model", "spanbert", "--init_from", str(bert_checkpoint))
    _, nsp = started_model(tmp_path, "--model", "bert_2seq_nsp", "--init_from", str(bert_checkpoint))
    assert any("this model has no NSP head" in note for note in spanbert.notes)
    assert not any("NSP head (`cls.seq_relationship`): loaded" in note for note in spanbert.notes)
    assert any("NSP head (`cls.seq_relationship`): loaded where the checkpoint has them" in note for note in nsp.notes)
    assert "cls.seq_relationship.weight" in nsp.loads
    _, electra = started_model(tmp_path, "--model", "electra", "--init_from", str(electra_pair[0]))
    assert not any("--init_generator_from" in note and "own copy" in note for note in electra.notes)
    assert not any(flag == "--init_generator_from" for flag, _ in electra.unused)
    for init in (spanbert, nsp, electra):
        names = [line.split(" | ")[0] for line in init.table().splitlines()[2:]]
        assert len(names) == len(set(names)), init.table()  # a name shared by several rows hides which is which
        for line in init.table().splitlines()[2:]:
            cells = line.strip("|").split(" | ")
            assert cells[1].strip() != "1" or "*" not in cells[0], line  # a lone tensor is named in full


def test_a_given_tokenizer_is_reused_by_the_content_of_its_files_not_their_path(tmp_path, bert_checkpoint, caplog):
    """The record of OUTPUT_DIR/tokenizer keys the --init_from checkpoint's tokenizer by its files: the same files at
    another path are reused (said in the log), changed files at the same path are not, except by a resumed run, whose
    checkpoints were trained with the saved one."""
    import datasets

    from encoder_zoo.training import pretrain as pretrain_module
    from encoder_zoo.training.run.folders import TOKENIZER_SOURCE, reusable_tokenizer, save_tokenizer

    docs = datasets.Dataset.from_dict({"text": SENTENCES})
    moved = tmp_path / "moved"
    shutil.copytree(bert_checkpoint, moved)

    def fingerprint(checkpoint):
        args, _ = pretrain_module.parse_args(["--model", "bert", "--init_from", str(checkpoint), "--output_dir",
                                              str(tmp_path / "run")])
        return pretrain_module.tokenizer_fingerprint(args, docs)

    first, same_files = fingerprint(bert_checkpoint), fingerprint(moved)
    assert first == same_files and first[TOKENIZER_SOURCE] and str(bert_checkpoint) not in str(first)
    saved = tmp_path / "run" / "tokenizer"
    save_tokenizer(transformers.AutoTokenizer.from_pretrained(bert_checkpoint), saved, first)
    with caplog.at_level("INFO"):
        assert reusable_tokenizer(saved, same_files, resuming=False)
    assert f"Reusing the tokenizer in {saved}: made from the same inputs (a given tokenizer whose files hash to " \
           f"{first[TOKENIZER_SOURCE]})" in caplog.text
    (moved / "tokenizer.json").write_text((moved / "tokenizer.json").read_text().replace("[unused1]", "[unused-one]"))
    changed = fingerprint(moved)
    assert {key for key in first if first[key] != changed[key]} == {TOKENIZER_SOURCE}
    with pytest.raises(FileExistsError, match=f"was made from other inputs \\({TOKENIZER_SOURCE}: "):
        reusable_tokenizer(saved, changed, resuming=False)
    assert reusable_tokenizer(saved, changed, resuming=True)
    assert "the resumed run keeps this one, which its checkpoints were trained with" in caplog.text


@pytest.mark.slow
def test_a_continued_run_resumes_from_its_checkpoint_alone_once_its_starting_checkpoint_is_gone(tmp_path,
                                                                                                bert_checkpoint):
    """Its checkpoint holds every weight, OUTPUT_DIR/tokenizer its tokenizer and init_from.json the card's record: the
    run resumes as one never stopped (the same logs and export); without those files it says which is missing."""
    import signal

    from helpers import pretrain
    from test_resume import assert_same_weights, start, step_logs, wait_for

    starting = tmp_path / "starting"
    shutil.copytree(bert_checkpoint, starting)
    args = ["--model", "spanbert", "--init_from", str(starting), "--max_seq_length", "64", "--max_documents", "40",
            "--per_device_train_batch_size", "8", "--validation_documents", "4", "--logging_steps", "1",
            "--save_steps", "3", "--warmup_steps", "1", "--dataloader_num_workers", "0", "--max_steps", "6"]
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    pretrain(*args, "--output_dir", str(reference))
    process = start(*args, "--output_dir", str(resumed))
    wait_for(resumed / "checkpoint-3", process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    shutil.rmtree(starting)
    result = pretrain(*args, "--output_dir", str(resumed), "--resume_from_checkpoint", "true")
    assert f"The starting checkpoint cannot be read now (--init_from {starting}: no such folder" in result.stderr
    assert step_logs(resumed, 6) == step_logs(reference, 6)
    assert_same_weights(reference / "export" / "model.safetensors", resumed / "export" / "model.safetensors")
    assert card_without_time(resumed / "export") == card_without_time(reference / "export")  # but wall-clock

    shutil.rmtree(resumed / "tokenizer")
    result = pretrain(*args, "--output_dir", str(resumed), "--resume_from_checkpoint", "true", check=False)
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and f"--init_from {starting}: no such folder" in line, result.stderr[-2000:]
    assert f"Resuming without it needs what the run saved, but {resumed} has no tokenizer/" in line
