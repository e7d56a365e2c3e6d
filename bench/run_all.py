"""Run every benchmark in turn (`make bench`), then print the results as Markdown for the README.

    python bench/run_all.py [--only masking spanbert ...] [--summary_only]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {
    "masking": ["bench_masking.py"],
    "preprocessing": ["bench_preprocessing.py"],
    "spanbert": ["bench_spanbert.py"],
    "teams": ["bench_teams.py"],
    "cloze": ["bench_cloze.py"],
    "hire": ["bench_hire.py"],
    "bertac_cnn": ["bench_bertac_cnn.py"],
    "bertac": ["bench_bertac.py"],
    "glue": ["bench_glue_minilm.py"],
    "qa": ["bench_qa_minilm.py"],
    "gpu": ["bench_gpu.py"],
}
NEEDS_CUDA = {"gpu"}


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def summary() -> str:
    lines = []
    for path in sorted((HERE / "results").glob("*.json")):
        result = json.loads(path.read_text())
        machine = result.pop("machine", {})
        gpu = f", GPU {machine['gpu']}" if machine.get("gpu") else ""
        family = (f", family/model/stepping {machine['cpu_family_model_stepping']}"
                  if machine.get("cpu_family_model_stepping") else "")
        lines.append(f"### {path.stem}\nmachine: {machine.get('cpu')}{family} ({machine.get('cores')} cores){gpu}, "
                     f"torch {machine.get('torch')}, {machine.get('date')}\n")
        lines.append("| key | value |\n| --- | --- |")
        for key, value in result.items():
            if isinstance(value, dict):  # one level of nesting, e.g. per-dataset results
                lines.extend(f"| {key}.{inner} | {v} |" for inner, v in value.items())
            else:
                lines.append(f"| {key} | {value} |")
        lines.append("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=sorted(SCRIPTS), help="Run only these benchmarks.")
    parser.add_argument("--summary_only", action="store_true", help="Print the stored results without running.")
    options = parser.parse_args()
    if not options.summary_only:
        for name in options.only or SCRIPTS:
            script, *args = SCRIPTS[name]
            if not (HERE / script).exists():
                print(f"skipping {name}: {script} not found", file=sys.stderr)
                continue
            if name in NEEDS_CUDA and not cuda_available():
                print(f"skipping {name}: no CUDA device (python bench/{script} --smoke checks it on CPU)",
                      file=sys.stderr)
                continue
            print(f"== {name}", flush=True)
            subprocess.run([sys.executable, str(HERE / script), *args], check=True)
    print(summary())


if __name__ == "__main__":
    main()
