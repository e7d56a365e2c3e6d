"""What a resume costs, early and late in a run: seconds from `pretrain.py --resume_from_checkpoint` starting to its
first trained step, from checkpoint-10 and from checkpoint-1000 of the same run, in memory, with `--pretokenized` and
with `--streaming` (tiny SpanBERT, 128-token blocks of the embedded corpus, batch 8: 1,000 steps are 8,000 examples,
most of a pass over the 10k documents). A fresh start of the same run is timed beside them.

The clock stops at the first logged step (`--logging_steps 1`; the log line's own time stamp), then the run is
stopped: each figure is start-up (imports, reading and packing what the run needs, loading the checkpoint) plus
whatever a resume does to find its place (Trainer skipping consumed batches, the stream restoring its position).

    python bench/bench_resume.py [--steps 1000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_result

REPO = Path(__file__).resolve().parent.parent
PRETRAIN = REPO / "training" / "pretrain.py"
COMMON = ["--model", "spanbert", "--model_size", "tiny", "--max_seq_length", "128", "--tokenizer_vocab_size", "1000",
          "--per_device_train_batch_size", "8", "--logging_steps", "1", "--warmup_steps", "5", "--disable_tqdm", "true",
          "--dataloader_num_workers", "0", "--validation_documents", "20"]
MODES = {"in memory": [], "--pretokenized": None,  # filled with the folder
         "--streaming": ["--streaming", "true", "--streaming_sample_documents", "500"]}
FIRST_STEP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*Step (\d+), time since the last log", re.M)


def env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def run(args: list[str]) -> None:
    subprocess.run([sys.executable, str(PRETRAIN), *args], check=True, env=env(), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def stopped_after(checkpoint: Path, args: list[str]) -> None:
    process = subprocess.Popen([sys.executable, str(PRETRAIN), *args], env=env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    while not checkpoint.exists():
        if process.poll() is not None:
            raise RuntimeError(f"the run ended before {checkpoint} was saved")
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def seconds_to_first_step(args: list[str]) -> tuple[float, int]:
    """Start a run; return (seconds until its first logged step, that step) and stop it."""
    started = time.time()
    process = subprocess.Popen([sys.executable, str(PRETRAIN), *args], env=env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    text = ""
    try:
        for line in process.stderr:
            text += line
            found = FIRST_STEP.search(line)
            if found:
                stamp = datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                return stamp - started, int(found.group(2))
        raise RuntimeError(f"the run ended before its first step:\n{text[-3000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    options = parser.parse_args()
    late = options.steps
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        pretokenized = scratch / "data"
        subprocess.run([sys.executable, str(REPO / "training" / "pretokenize.py"), "--model", "spanbert",
                        "--output_dir", str(pretokenized), "--max_seq_length", "128", "--tokenizer_vocab_size",
                        "1000", "--validation_documents", "20"], check=True, env=env(), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        MODES["--pretokenized"] = ["--pretokenized", str(pretokenized)]
        for mode, extra in MODES.items():
            flags = [*COMMON, *extra]
            if mode == "--pretokenized":  # the folder holds the tokenizer and the held-out split
                flags = [*COMMON[:6], *COMMON[8:-2], *extra]
            trained = scratch / ("run-" + mode.strip("-").replace(" ", "_"))
            total = ["--max_steps", str(late + 50)]
            print(f"{mode}: training {late} steps...", flush=True)
            run([*flags, *total, "--output_dir", str(trained), "--save_steps", str(late)])
            early = scratch / f"{trained.name}-early"  # the same run, stopped once checkpoint-10 is saved
            stopped_after(early / "checkpoint-10", [*flags, *total, "--output_dir", str(early), "--save_steps", "10"])
            row = {"mode": mode}
            for name, folder, keep in (("fresh start", None, None), ("resume at step 10", early, 10),
                                       (f"resume at step {late}", trained, late)):
                best = None
                for repeat in range(options.repeats):
                    if folder is None:
                        out = scratch / f"fresh-{repeat}"
                        shutil.rmtree(out, ignore_errors=True)
                        seconds, step = seconds_to_first_step([*flags, *total, "--output_dir", str(out),
                                                               "--save_steps", str(late)])
                    else:
                        copy = scratch / f"resume-{repeat}"
                        shutil.rmtree(copy, ignore_errors=True)
                        shutil.copytree(folder, copy)
                        for checkpoint in copy.glob("checkpoint-*"):
                            if checkpoint.name != f"checkpoint-{keep}":
                                shutil.rmtree(checkpoint)
                        seconds, step = seconds_to_first_step([*flags, *total, "--output_dir", str(copy),
                                                               "--save_steps", str(late),
                                                               "--resume_from_checkpoint", "true"])
                        assert step == keep + 1, (mode, name, step)
                    best = seconds if best is None else min(best, seconds)
                row[name] = round(best, 2)
                print(f"  {name}: {best:.2f} s to the first step", flush=True)
            rows.append(row)
    write_result("resume", {"what": "seconds from start to the first trained step (best of repeats)",
                            "model": "spanbert tiny, 128-token blocks, batch 8, one thread", "steps": late,
                            "rows": rows})


if __name__ == "__main__":
    main()
