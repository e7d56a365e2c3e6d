"""`--streaming`: a deterministic, endless stream of packed examples that a killed run resumes bitwise, without
reading the consumed part of the corpus again."""

import itertools
import json
import signal

import pytest
import torch
from helpers import pretrain
from test_resume import assert_same_weights, start, step_logs, wait_for

# 40 documents, ~12 steps of 8 blocks per pass over them: 30 steps cross two epochs of the stream, checkpoint-20 lies
# inside the second, in the middle of a 10-document window.
STREAM = ["--streaming", "--model_size", "tiny", "--max_seq_length", "64", "--max_documents", "40",
          "--validation_documents", "4", "--tokenizer_vocab_size", "1000", "--per_device_train_batch_size", "8",
          "--shuffle_window_documents", "10", "--streaming_sample_documents", "100", "--max_steps", "30",
          "--logging_steps", "1", "--save_steps", "10", "--save_total_limit", "5", "--warmup_steps", "5",
          "--dataloader_num_workers", "0"]


def tokenizer():
    from transformers import AutoTokenizer

    from encoder_zoo.training.data.resources import minilm_path

    return AutoTokenizer.from_pretrained(minilm_path())


def stream(start=None, documents=None, window=7, world_size=1, rank=0, seed=1):
    from encoder_zoo.training.data.blocks import block_packer
    from encoder_zoo.training.data.corpus import stream_corpus
    from encoder_zoo.training.data.streaming import StreamedExamples, StreamSettings

    return StreamedExamples(documents or stream_corpus(max_documents=60), block_packer(tokenizer(), 64),
                            text_column="text",
                            settings=StreamSettings(seed=seed, window_documents=window, world_size=world_size),
                            rank=rank, start=start)


def ids(examples):
    return [tuple(example["input_ids"].tolist()) for example in examples]


def test_stream_order_is_seeded_shuffled_and_new_each_epoch():
    from encoder_zoo.training.data.blocks import block_packer
    from encoder_zoo.training.data.corpus import load_corpus

    first = list(itertools.islice(iter(stream()), 400))
    again = list(itertools.islice(iter(stream()), 400))
    assert ids(first) == ids(again) and [e["example_index"] for e in first] == list(range(400))
    other_seed = list(itertools.islice(iter(stream(seed=2)), 400))
    assert ids(other_seed) != ids(first) and sorted(ids(other_seed)[:100]) != sorted(ids(first)[:100])
    # One epoch is exactly the blocks that pack_blocks makes of the 60 documents, each once, in another order.
    blocks = [tuple(b) for b in load_corpus(max_documents=60).map(block_packer(tokenizer(), 64), batched=True,
                                                                  remove_columns=["text", "title"])["input_ids"]]
    epoch = len(blocks)
    assert sorted(ids(first)[:epoch]) == sorted(blocks) and ids(first)[:epoch] != blocks
    assert ids(first)[epoch : 2 * epoch] != ids(first)[:epoch]  # the next epoch is another order...
    assert sorted(ids(first)[epoch : 2 * epoch]) == sorted(blocks)  # ...of the same blocks, with new indices
    assert first[epoch]["example_index"] == epoch


def test_two_processes_stream_disjoint_halves():
    from encoder_zoo.training.data.corpus import stream_corpus

    documents = stream_corpus(max_documents=60)  # 16 shards: 8 per process
    halves = [ids(itertools.islice(iter(stream(documents=documents, world_size=2, rank=rank)), 60)) for rank in (0, 1)]
    assert not set(halves[0]) & set(halves[1])
    indices = [e["example_index"] for e in itertools.islice(iter(stream(documents=documents, world_size=2, rank=1)), 3)]
    assert indices == [1, 3, 5]  # count * processes + rank: no index is shared between processes


def test_a_restored_position_continues_with_the_next_example_reading_one_window(monkeypatch):
    import encoder_zoo.training.data.streaming as streaming
    from encoder_zoo.training.data.streaming import StreamPosition

    reference = ids(itertools.islice(iter(stream()), 300))
    head = stream()
    list(itertools.islice(iter(head), 250))  # deep in the second epoch
    saved = json.loads(json.dumps(vars(head.position)))  # what a checkpoint holds
    assert saved["epoch"] == 1 and saved["window"] > 0 and 0 < saved["offset"]

    read = []
    original = streaming.document_texts

    def counting(rows, *args):
        for text in original(rows, *args):
            read.append(text)
            yield text

    monkeypatch.setattr(streaming, "document_texts", counting)
    examples = iter(stream(start=StreamPosition(**saved)))
    resumed = [next(examples)]
    assert 0 < len(read) <= 7  # the saved window's documents again, not the 1.5 epochs before it
    resumed += itertools.islice(examples, 49)
    assert ids(resumed) == reference[250:]
    assert [e["example_index"] for e in resumed] == list(range(250, 300))


@pytest.mark.slow
def test_killed_streaming_run_resumes_bitwise(tmp_path):
    """SIGKILL after checkpoint-20 (second epoch of the stream), then --resume_from_checkpoint true: every step's
    losses, the held-out losses, the final weights and the Adam moments equal the uninterrupted run's bitwise. The
    killed and resumed runs pack in 2 processes (--dataloader_num_workers 2), the reference in its own: the same
    examples, and a position saved exactly whatever the pool."""
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    pretrain("--model", "spanbert", *STREAM, "--output_dir", str(reference))
    args = ["--model", "spanbert", *STREAM, "--dataloader_num_workers", "2", "--output_dir", str(resumed)]
    process = start(*args)
    wait_for(resumed / "checkpoint-20", process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not (resumed / "checkpoint-30").exists()
    # Partition 0 of 8 (one of 8 examples per update): 20 of its examples trained, past its first epoch.
    position = json.loads((resumed / "checkpoint-20" / "stream_state-partition0.json").read_text())["position"]
    assert position["epoch"] >= 1 and position["count"] == 20, position
    assert sorted(p.name for p in (resumed / "checkpoint-20").glob("stream_state-*")) == [
        f"stream_state-partition{j}.json" for j in range(8)]
    result = pretrain(*args, "--resume_from_checkpoint", "true")
    assert "checkpoint-20" in result.stderr

    expected, actual = step_logs(reference, 30), step_logs(resumed, 30)
    assert sorted(actual) == list(range(1, 31)) and actual == expected  # every logged float, epoch included
    assert_same_weights(reference / "export" / "model.safetensors", resumed / "export" / "model.safetensors")
    optimizer = [torch.load(out / "checkpoint-30" / "optimizer.pt", weights_only=False)["state"]
                 for out in (reference, resumed)]
    for key in optimizer[0]:
        for name, value in optimizer[0][key].items():
            assert torch.equal(value, optimizer[1][key][name])
    card = (resumed / "export" / "README.md").read_text()
    assert "| examples | 240 streamed |" in card and "streamed." in card


def test_streaming_refuses_what_it_cannot_do(tmp_path, monkeypatch, capsys):
    from test_pretokenize import refused

    def refuses(*args):
        argv = ["--model_size", "tiny", "--output_dir", str(tmp_path / "run"), "--max_documents", "40", *args]
        return refused("encoder_zoo.training.pretrain", argv, monkeypatch, capsys)

    last = refuses("--model", "bert_2seq", "--streaming", "--max_steps", "2", "--dataloader_num_workers", "0")
    assert "whole corpus" in last and "pretokenize" in last
    assert "pass --max_steps" in refuses("--model", "spanbert", "--streaming", "--num_train_epochs", "1")
    assert "divide the global batch of 32" in refuses("--model", "spanbert", "--streaming", "--max_steps", "2",
                                                     "--stream_partitions", "3")
    assert not list(tmp_path.rglob("checkpoint-*"))


@pytest.mark.parametrize("layout, world_size", [("global", 2), ("per_process", 2)])
def test_a_checkpoint_of_an_older_layout_resumes_as_it_was_saved(tmp_path, layout, world_size):
    """A checkpoint whose stream state is `stream_state-rank<N>.json` (the global layout, or the per-process one
    before it), as those layouts' StreamedExamples saved it, continues in that layout: rank 1 of 2 restarts with the
    examples that followed its saved position, not with a partitioned stream."""
    from types import SimpleNamespace

    from encoder_zoo.training.data.corpus import stream_corpus
    from encoder_zoo.training.data.streaming import StreamedExamples, StreamSettings
    from encoder_zoo.training.pretrain import streamed_examples

    documents = stream_corpus(max_documents=60)
    settings = StreamSettings(seed=1, window_documents=7, world_size=world_size, micro_batch=4, layout=layout)

    def old(rank, start=None):
        from encoder_zoo.training.data.blocks import block_packer

        return StreamedExamples(documents, block_packer(tokenizer(), 64), text_column="text", settings=settings,
                                rank=rank, start=start)

    reference = [ids(itertools.islice(iter(old(rank)), 40)) for rank in range(world_size)]
    saving = [old(rank) for rank in range(world_size)]
    for stream in saving:
        list(itertools.islice(iter(stream), 24))  # 6 updates of 2 x 4 (global) or 24 own examples (per process)
        stream.save(tmp_path, consumed=6 * 8 if layout == "global" else None)
    args = SimpleNamespace(shuffle_window_documents=7, text_column="text", stream_partitions=None, model="spanbert",
                           max_seq_length=64, masking_scheme="geometric", spacy_model=None)
    training_args = SimpleNamespace(seed=1, world_size=world_size, per_device_train_batch_size=4, process_index=1,
                                    gradient_accumulation_steps=1, dataloader_num_workers=0)
    recipe = SimpleNamespace(document_packer=None)
    resumed = streamed_examples(documents, None, recipe, tokenizer(), args, training_args, str(tmp_path))
    assert type(resumed) is StreamedExamples and resumed.settings.layout == layout
    assert ids(itertools.islice(iter(resumed), 16)) == reference[1][24:40]


def test_the_clock_shares_an_interval_between_its_phases():
    """Host-timed phases (no CUDA here): a slow data wait shows as the data share, and the shares with `other` add up
    to the interval; the totals carry over a checkpoint."""
    import time

    from encoder_zoo.training.run.timing import TimeShares, shares_text

    clock = TimeShares(cuda=False)
    clock.restart()
    for _ in range(3):
        clock.begin("data")
        time.sleep(0.06)
        clock.end("data")
        clock.begin("forward_backward", device=True)
        time.sleep(0.02)
        clock.end("forward_backward", device=True)
    seconds = clock.interval()
    assert seconds["data"] >= 0.18 and 0.06 <= seconds["forward_backward"] < seconds["data"]
    assert abs(sum(seconds[k] for k in ("data", "forward_backward", "optimizer", "checkpoint", "other"))
               - seconds["wall"]) < 1e-6
    text = shares_text(seconds)
    share = int(text.split("waiting for data ")[1].split("%")[0])
    assert 65 <= share <= 80, text
    assert clock.interval()["data"] == 0  # the next interval starts empty
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    clock.save(folder)
    again = TimeShares(cuda=False)
    again.load(folder)
    assert abs(again.totals["data"] - clock.totals["data"]) < 1e-3


def test_a_missing_or_damaged_stream_position_is_named_in_one_line(tmp_path):
    """A streaming checkpoint without its stream state is called incomplete (not 'not a streaming run': the run's
    recorded flags already said it streamed); a damaged state file is named with the way out."""
    from encoder_zoo.training.data.streaming import (
        PARTITIONED,
        StreamSettings,
        load_partition_positions,
    )

    settings = StreamSettings(seed=1, window_documents=7, world_size=1, layout=PARTITIONED, partitions=2,
                              global_batch=8)
    with pytest.raises(FileNotFoundError, match=r"holds no stream position .*: the checkpoint is incomplete\. "
                                                r"Resume from an earlier checkpoint"):
        load_partition_positions(tmp_path, [0, 1], settings)
    (tmp_path / "stream_state-partition0.json").write_text('{"settings": {"seed": 1')
    with pytest.raises(ValueError, match=r"stream_state-partition0.json is damaged \(JSONDecodeError: .*\); it holds "
                                         r"the stream's position\. Resume from an earlier checkpoint"):
        load_partition_positions(tmp_path, [0, 1], settings)
