r"""Per-layer importance heatmap of HIRE models across tasks (the paper's Figure 2).

    python glue/hire_importance.py --trust_remote_code --output_dir runs/importance \
        --run rotten_tomatoes=runs/glue/rotten_tomatoes/seed-1 \
        --run movie_sentiment_regression=runs/glue/movie_sentiment_regression/seed-1

Each --run TASK=MODEL_DIR averages the importance scores s of a fine-tuned HIRE classifier over the task's validation
examples; rows are tasks, columns layers (0 = embeddings). The scores are printed, and written with the figure into
--output_dir: importance.png (--output) and importance.json. Cells carry their values; the colour scale is centred on
the uniform level 1/L, marked on the colour bar, and spans at least 0 to 2/L. A HIRE checkpoint carries its code,
which runs only with --trust_remote_code (as in run_glue.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch


def mean_importance(model_dir: str, task_name: str, max_examples: int = 256, batch_size: int = 32,
                    trust_remote_code: bool = False) -> np.ndarray:
    """The importance scores s of the HIRE classifier in `model_dir`, averaged over the task's validation examples.
    Its code (in the folder) runs only with `trust_remote_code`, or where this process registered HIRE's classes."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from encoder_zoo.glue.tasks import load_task
    from encoder_zoo.training.run import load_pretrained

    tokenizer = load_pretrained(AutoTokenizer, model_dir, "--run", trust_remote_code=trust_remote_code)
    model = load_pretrained(AutoModelForSequenceClassification, model_dir, "--run",
                            trust_remote_code=trust_remote_code).eval()
    if getattr(model.config, "model_type", None) != "hire":
        raise ValueError(f"--run {task_name}={model_dir} is a {getattr(model.config, 'model_type', None)!r} model "
                         f"({type(model).__name__}), not HIRE: only a HIRE classifier computes layer importance. Make "
                         "one with glue/init_hire.py, fine-tune it with glue/run_glue.py, and pass that folder.")
    task, data = load_task(task_name)
    split = data[task.validation_splits[0]].select(range(min(max_examples, len(data[task.validation_splits[0]]))))
    scores = []
    batches = range(0, len(split), batch_size)
    with torch.no_grad():
        for start in hf_logging.tqdm(batches, desc=f"Importance on {task_name}", unit="batch"):
            batch = split[start : start + batch_size]
            encoded = tokenizer(*[batch[c] for c in task.text_columns], padding=True, truncation=True, max_length=128,
                                return_tensors="pt")
            importance = getattr(model(**encoded), "layer_importance", None)
            if importance is None:
                raise ValueError(f"--run {task_name}={model_dir} returns no layer importance: HIRE's extractor is off "
                                 "in this model (the --without_hire ablation), so there is nothing to draw.")
            scores.append(importance)
    return torch.cat(scores).mean(0).numpy()


def importance_figure(scores: dict[str, np.ndarray], title: str = "HIRE layer importance"):
    """Heatmap: one row per task (or example), one column per hidden state, each cell's score written in it.

    The colour scale diverges from the uniform level 1/L (white), which is marked on the colour bar, and spans at
    least 0 (a layer ignored) to 2/L (twice its uniform share): scores close to uniform stay pale instead of
    looking structured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    names = list(scores)
    matrix = np.stack([np.asarray(scores[n], dtype=float) for n in names])
    uniform = 1.0 / matrix.shape[1]
    top = max(float(matrix.max()), 2 * uniform)  # scores are probabilities: 0 is the floor
    norm = TwoSlopeNorm(vcenter=uniform, vmin=0.0, vmax=top)
    fig, ax = plt.subplots(figsize=(3.0 + 0.75 * matrix.shape[1], 1.2 + 0.5 * len(names)), dpi=120)
    image = ax.imshow(matrix, cmap="RdBu_r", norm=norm, aspect="auto")
    for (row, column), value in np.ndenumerate(matrix):
        strong = abs(norm(value) - 0.5) > 0.3
        ax.text(column, row, f"{value:.3f}", ha="center", va="center", fontsize=7, color="white" if strong else "black")
    ax.set_xticks(range(matrix.shape[1]), [str(i) for i in range(matrix.shape[1])])
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_title(title)
    bar = fig.colorbar(image, ax=ax, fraction=0.04)
    bar.set_ticks([0.0, uniform, top], labels=["0", f"uniform 1/{matrix.shape[1]} = {uniform:.3f}", f"{top:.3f}"])
    bar.ax.axhline(uniform, color="black", linewidth=1)
    fig.tight_layout()
    return fig


def plot_importance(scores: dict[str, np.ndarray], path: str | Path, title: str = "HIRE layer importance") -> Path:
    """Save `importance_figure` as a PNG."""
    import matplotlib.pyplot as plt

    fig = importance_figure(scores, title)
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def importance_table(scores: dict[str, np.ndarray]) -> str:
    """The scores as a Markdown table: one row per task, one column per layer (0 = embeddings)."""
    layers = len(next(iter(scores.values())))
    lines = ["| task | " + " | ".join(f"layer {i}" for i in range(layers)) + " |", "| --- |" + " --- |" * layers]
    lines += [f"| {task} | " + " | ".join(f"{value:.3f}" for value in values) + " |" for task, values in scores.items()]
    return "\n".join(lines)


def main(argv=None):
    import json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="TASK=MODEL_DIR")
    parser.add_argument("--output_dir", default="runs/hire_importance",
                        help="Folder for the figure and importance.json (default: runs/hire_importance).")
    parser.add_argument("--output", default="importance.png",
                        help="The figure's file name, inside --output_dir (an absolute path is taken as it is).")
    parser.add_argument("--max_examples", type=int, default=256)
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="Run the model code saved in each MODEL_DIR (a HIRE checkpoint carries HIRE's).")
    options = parser.parse_args(argv)
    runs = []
    for run in options.run:
        task, _, model_dir = run.partition("=")
        if not model_dir:
            parser.error(f"--run {run!r} is not TASK=MODEL_DIR")
        runs.append((task, model_dir))
    scores = {task: mean_importance(model_dir, task, options.max_examples, trust_remote_code=options.trust_remote_code)
              for task, model_dir in runs}
    output = Path(options.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    figure = plot_importance(scores, output / options.output)
    numbers = output / "importance.json"
    numbers.write_text(json.dumps({task: [round(float(v), 6) for v in values] for task, values in scores.items()},
                                  indent=1))
    print(f"Layer importance (mean over up to {options.max_examples} validation examples; uniform = "
          f"{1 / len(next(iter(scores.values()))):.3f}):")
    print(importance_table(scores))
    print(f"Figure: {figure}\nNumbers: {numbers}")
    return figure


def cli() -> None:
    from encoder_zoo.training.run import run_cli

    run_cli(main, "hire_importance.py",
            interrupted="interrupted (Ctrl-C); nothing was written. Run the same command again.")


if __name__ == "__main__":
    cli()
