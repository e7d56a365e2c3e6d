"""The reports' figures: a paper's scores per task (`plot`), the zoo's scores against pretraining FLOPs (`plot_zoo`)."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

from encoder_zoo.repro.budgets import arm_label
from encoder_zoo.repro.tasks import display_scale, task_facts


def plot(results: dict, sweep, path: Path) -> None:
    """One panel per task: every unit's score (dots; the runs of a unit in gray), the mean over units and its t
    interval, the floors (chance red, the trivial models orange), on the tables' scale (`display_scale`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sweep.tasks
    figure, axes = plt.subplots(1, len(tasks), figsize=(max(6, 4 * len(tasks)), 3.8), squeeze=False)
    names = list(results["arms"])
    for ax, task in zip(axes[0], tasks):
        scale = display_scale(task)
        for i, name in enumerate(names):
            r = results["arms"][name]["tasks"].get(task)
            if r:
                ax.scatter([i + 0.12] * len(r["runs"]), [run["value"] * scale for run in r["runs"]], s=6,
                           alpha=0.35, color="gray")
                ax.scatter([i] * r["n_units"], [v * scale for v in r["units"].values()], s=18, color=f"C{i}",
                           zorder=3)
                if r["low"] is not None:
                    mean, low, high = (r[k] * scale for k in ("mean", "low", "high"))
                    ax.errorbar([i - 0.12], [mean], yerr=[[mean - low], [high - mean]], fmt="_", color="black",
                                capsize=4, markersize=10)
        ax.set_xticks(range(len(names)), [arm_label(name, results) for name in names], rotation=30, ha="right",
                      fontsize=8)
        ax.set_xlim(-0.5, len(names) - 0.5)
        if floor_lines(ax, results, task):
            ax.legend(fontsize=7, loc="best")
        ax.set_title(task_facts(task).description, fontsize=9)
        ax.set_ylabel(task_facts(task).unit, fontsize=8)
    title = (f"{sweep.experiment.name}, {sweep.budget.name} budget: every unit (dots), mean over units and its 95% t "
             "interval (black), fine-tuning runs (gray), floors (chance red, trivial models orange)")
    figure.suptitle(textwrap.fill(title, width=int(figure.get_figwidth() * 14)), fontsize=9)  # one panel is narrow
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def floor_lines(ax, results: dict, task: str) -> bool:
    """Each floor of `task` as a horizontal line (chance red dotted, a trivial model orange dashed); whether any."""
    floors = [f for f in results.get("floors", {}).get(task, []) if f.get("value") is not None]
    for floor in floors:
        chance = floor["kind"] == "chance"
        ax.axhline(floor["value"] * display_scale(task), color="red" if chance else "orange",
                   linestyle=":" if chance else "--", linewidth=1, label=floor["kind"].replace("_", " "))
    return bool(floors)


def plot_zoo(results: dict, sweep, path: Path) -> None:
    """Score against pretraining FLOPs, one panel per task: every unit's point, a marker per method. Fusions over
    MiniLM have no FLOPs of ours and are left out of the plot (the table lists them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(sweep.tasks)
    figure, axes = plt.subplots(1, len(tasks), figsize=(max(6, 4.2 * len(tasks)), 4), squeeze=False)
    markers = itertools.cycle("os^vDP*Xhp")
    style = {name: (f"C{i}", next(markers)) for i, name in enumerate(results["arms"])}
    for ax, task in zip(axes[0], tasks):
        for name, arm in results["arms"].items():
            r = arm["tasks"].get(task)
            if not r:
                continue
            points = [(arm["compute"][unit]["flops"], value * display_scale(task)) for unit, value in
                      r["units"].items() if arm["compute"].get(unit, {}).get("flops")]
            if points:
                color, marker = style[name]
                ax.scatter(*zip(*points), color=color, marker=marker, s=26, label=arm_label(name, results), alpha=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("pretraining FLOPs", fontsize=8)
        ax.set_ylabel(task_facts(task).unit, fontsize=8)
        ax.set_title(task_facts(task).description, fontsize=9)
        floor_lines(ax, results, task)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5) or 1, fontsize=7)
    figure.suptitle(f"zoo, {sweep.budget.name} budget: every unit's score against its pretraining FLOPs (floors: "
                    "chance dotted red, trivial models dashed orange)", fontsize=9)
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)
