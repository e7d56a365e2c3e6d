"""Every count flag of pretrain.py is checked at parse time: a batch size, accumulation, interval, limit, window or
partition count that is not a positive whole number is refused in one line naming the flag and what it counts,
before anything divides by it (a per-device batch or accumulation of 0 was a ZeroDivisionError traceback; an
interval of 0 or -1 and a --stream_partitions 0 were silently replaced), and nothing is written."""

import pytest
from test_pretokenize import refused


@pytest.mark.parametrize("flag, value, named", [
    ("--per_device_train_batch_size", "0", "--per_device_train_batch_size 0: pass a positive whole number (examples "
                                           "each process trains on per micro-batch)."),
    ("--per_device_train_batch_size", "-2", "--per_device_train_batch_size -2: pass a positive whole number"),
    ("--per_device_eval_batch_size", "0", "--per_device_eval_batch_size 0: pass a positive whole number"),
    ("--gradient_accumulation_steps", "0", "--gradient_accumulation_steps 0: pass a positive whole number "
                                           "(micro-batches per update)."),
    ("--save_steps", "0", "--save_steps 0: pass a positive whole number (updates between checkpoints), or a "
                          "fraction of the run's updates below 1."),
    ("--logging_steps", "-1", "--logging_steps -1: pass a positive whole number"),
    ("--eval_steps", "-0.5", "--eval_steps -0.5: pass a positive whole number"),
    ("--save_total_limit", "0", "--save_total_limit 0: pass a positive whole number (checkpoints kept; drop it to "
                                "keep all)."),
    ("--shuffle_window_documents", "0", "--shuffle_window_documents 0: pass a positive whole number"),
    ("--stream_partitions", "0", "--stream_partitions 0: pass a positive whole number (partitions of the stream)."),
    ("--streaming_sample_documents", "0", "--streaming_sample_documents 0: pass a positive whole number"),
    ("--dataloader_num_workers", "-1", "--dataloader_num_workers -1: pass 0 (load and pack in the training process) "
                                       "or more."),
])
def test_a_count_flag_that_is_no_positive_whole_number_is_refused_in_one_line(tmp_path, monkeypatch, capsys, flag,
                                                                             value, named):
    out = tmp_path / "run"
    last = refused("encoder_zoo.training.pretrain", ["--model", "spanbert", "--model_size", "tiny", "--streaming",
                                                     "--max_steps", "4", "--output_dir", str(out), flag, value],
                   monkeypatch, capsys)
    assert last == f"pretrain.py: error: {named}" or last.startswith(f"pretrain.py: error: {named}")
    assert not out.exists()
