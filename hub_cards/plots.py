"""Figures that model cards embed."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_loss_curve(
    log_history: list[dict[str, Any]], path: str | Path, keys: tuple[str, ...] = ("loss",), ylabel: str = "loss"
) -> Path | None:
    """Draw the curves logged by Trainer (one line per key found: training logs and `eval_*` validation logs share
    the step axis) to a PNG; None when nothing was logged."""
    import matplotlib.pyplot as plt

    figure = loss_curve_figure(log_history, keys, ylabel)
    if figure is None:
        return None
    figure.savefig(path, bbox_inches="tight")
    plt.close(figure)
    return Path(path)


def loss_curve_figure(log_history: list[dict[str, Any]], keys: tuple[str, ...] = ("loss",), ylabel: str = "loss"):
    """The figure `plot_loss_curve` saves, its legend beside the axes so that it covers no curve; None when nothing
    was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {k: [(e["step"], e[k]) for e in log_history if k in e and "step" in e] for k in keys}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 3.5), dpi=120)
    colours = {}
    for name, points in series.items():
        steps, values = zip(*points)
        training = name.removeprefix("eval_")  # a validation curve: its training curve's colour, dashed
        line, = ax.plot(steps, values, label=name, marker="o" if len(points) <= 20 else None, markersize=3,
                        linestyle="--" if name != training else "-", color=colours.get(training))
        colours.setdefault(name, line.get_color())
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
