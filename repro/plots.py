"""The reports' figures: a paper's scores per task (`plot`), the zoo's scores against pretraining FLOPs (`plot_zoo`).

Each figure is drawn to be read at the width report.md and README show it (about 900 pixels): at most two panels a
row, a panel only for a task with data, titles wrapped inside their panel, and one legend for the figure with one
entry per meaning (`figure_structure` says what a test checks)."""

from __future__ import annotations

import itertools
import math
import textwrap
from pathlib import Path

from encoder_zoo.repro.budgets import arm_label
from encoder_zoo.repro.tasks import FLOOR_NAMES, display_scale, task_facts

COLUMNS = 2  # panels a row: four side by side are unreadable at the width a report is shown
PANEL = (4.6, 3.4)  # inches a panel, at 100 dpi
# One style per kind of floor, so chance, the trivial models and the unigram and bigram losses read apart.
FLOOR_STYLES = {"chance": ("red", ":"), "bag_of_words": ("darkorange", "--"), "trivial_answer": ("teal", "--"),
                "unigram": ("purple", "--"), "bigram": ("saddlebrown", "-.")}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plotted_tasks(results: dict, tasks) -> list[str]:
    """The tasks some arm has a score on (the held-out cloze loss where no two-tower model runs has none)."""
    return [task for task in tasks if any(arm["tasks"].get(task) for arm in results["arms"].values())]


def panels(plt, count: int):
    """A figure of `count` panels, `COLUMNS` a row, and its axes in order (the unused ones removed); with none, one
    panel saying so (every run failed: the report lists them)."""
    if not count:
        figure, ax = plt.subplots(figsize=(PANEL[0] * 2, PANEL[1]))
        ax.text(0.5, 0.5, "no arm has a score: every run failed (the report lists them)", ha="center", va="center")
        ax.set_axis_off()
        return figure, []
    rows, columns = math.ceil(count / COLUMNS), min(count, COLUMNS)
    figure, axes = plt.subplots(rows, columns, figsize=(PANEL[0] * max(columns, 2), PANEL[1] * rows + 1.0),
                                squeeze=False)
    axes = list(axes.flat)
    for ax in axes[count:]:
        ax.remove()
    return figure, axes[:count]


def title(ax, task: str) -> None:
    ax.set_title(textwrap.fill(task_facts(task).description, 48), fontsize=9)
    ax.set_ylabel(task_facts(task).unit, fontsize=8)
    ax.tick_params(labelsize=8)


def floor_lines(ax, results: dict, task: str) -> None:
    """Each distinct floor of `task` once, a horizontal line styled by its kind (`FLOOR_STYLES`)."""
    seen = set()
    for floor in results.get("floors", {}).get(task, []):
        if floor.get("value") is None or (floor["kind"], round(floor["value"], 9)) in seen:
            continue  # a floor per tokenizer or arm with the same value is one line
        seen.add((floor["kind"], round(floor["value"], 9)))
        color, style = FLOOR_STYLES.get(floor["kind"], ("gray", "--"))
        ax.axhline(floor["value"] * display_scale(task), color=color, linestyle=style, linewidth=1.2,
                   label=f"floor: {FLOOR_NAMES.get(floor['kind'], floor['kind'])}")


def legend(figure, axes) -> None:
    """One legend below the panels: every panel's entries, each label once."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    figure.legend(list(entries.values()), list(entries), loc="lower center", ncol=min(len(entries), 4) or 1,
                  fontsize=8, frameon=False)


def finish(figure, suptitle: str):
    """The figure with its title and room for the legend below the panels."""
    rows = math.ceil(len(figure.legends[0].get_texts()) / 4) if figure.legends else 0
    figure.suptitle(textwrap.fill(suptitle, int(figure.get_figwidth() * 13)), fontsize=9)
    figure.tight_layout(rect=(0, (0.22 * rows + 0.1) / figure.get_figheight(), 1, 1))
    return figure


def save(figure, path: Path) -> None:
    figure.savefig(path, dpi=100)
    _pyplot().close(figure)


def paper_figure(results: dict, sweep):
    """The figure `plot` saves (a test reads its structure, `figure_structure`)."""
    plt = _pyplot()
    tasks = plotted_tasks(results, sweep.tasks)
    figure, axes = panels(plt, len(tasks))
    names = list(results["arms"])
    for ax, task in zip(axes, tasks):
        scale = display_scale(task)
        for i, name in enumerate(names):
            r = results["arms"][name]["tasks"].get(task)
            if not r:
                continue
            ax.scatter([i + 0.15] * len(r["runs"]), [run["value"] * scale for run in r["runs"]], s=6,
                       alpha=0.4, color="gray", label="fine-tuning run")
            ax.scatter([i] * r["n_units"], [v * scale for v in r["units"].values()], s=18, color=f"C{i}",
                       zorder=3, label="unit: one trained model (colour: its arm)")
            if r["low"] is not None:
                mean, low, high = (r[k] * scale for k in ("mean", "low", "high"))
                ax.errorbar([i - 0.15], [mean], yerr=[[mean - low], [high - mean]], fmt="_", color="black",
                            capsize=4, markersize=10, label="mean over units, 95% t interval")
        ax.set_xticks(range(len(names)), [arm_label(name, results) for name in names], rotation=25, ha="right",
                      fontsize=8)
        ax.set_xlim(-0.5, len(names) - 0.5)
        floor_lines(ax, results, task)
        title(ax, task)
    legend(figure, axes)
    return finish(figure, f"{sweep.experiment.name}, {sweep.budget.name} budget: every unit's score (a dot per "
                          "independently trained model)")


def plot(results: dict, sweep, path: Path) -> None:
    """One panel per task with data: every unit's score (coloured dots), its fine-tuning runs (gray), the mean over
    units and its t interval (black), the floors (one style per kind), on the tables' scale (`display_scale`)."""
    save(paper_figure(results, sweep), path)


def zoo_figure(results: dict, sweep):
    """The figure `plot_zoo` saves (a test reads its structure, `figure_structure`)."""
    plt = _pyplot()
    tasks = plotted_tasks(results, sweep.tasks)
    figure, axes = panels(plt, len(tasks))
    markers = itertools.cycle("os^vDP*Xhp")
    style = {name: (f"C{i}", next(markers)) for i, name in enumerate(results["arms"])}
    for ax, task in zip(axes, tasks):
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
        floor_lines(ax, results, task)
        title(ax, task)
    legend(figure, axes)
    return finish(figure, f"zoo, {sweep.budget.name} budget: every unit's score against its pretraining FLOPs (a "
                          "method with no FLOPs of ours, MiniLM alone or a fusion over it without a CNN, is in the "
                          "table only)")


def plot_zoo(results: dict, sweep, path: Path) -> None:
    """Score against pretraining FLOPs, one panel per task with data: every unit's point, a marker per method, the
    floors. Fusions over MiniLM count only their CNN's FLOPs, and MiniLM alone has none of ours (the table lists it)."""
    save(zoo_figure(results, sweep), path)


def figure_structure(figure) -> dict:
    """What a test checks of a drawn figure: per panel its title and how many data points it draws (scatter points
    and interval bars, floors not counted), the legend's labels, and the texts that reach outside the figure or
    overlap another panel's title."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    bounds = figure.bbox
    axes = [ax for ax in figure.axes if ax.get_visible()]
    titles = [ax.title.get_window_extent(renderer) for ax in axes]
    texts = [figure._suptitle, *(ax.title for ax in axes)] if figure._suptitle else [ax.title for ax in axes]  # noqa: SLF001
    outside = [t.get_text() for t in texts if t.get_text() and not (
        bounds.x0 - 1 <= t.get_window_extent(renderer).x0 and t.get_window_extent(renderer).x1 <= bounds.x1 + 1
        and t.get_window_extent(renderer).y1 <= bounds.y1 + 1)]
    overlapping = [(axes[i].get_title(), axes[j].get_title()) for i, j in itertools.combinations(range(len(axes)), 2)
                   if titles[i].overlaps(titles[j])]
    points = [sum(len(c.get_offsets()) for c in ax.collections) + len(ax.containers) for ax in axes]
    labels = [t.get_text() for legend in figure.legends for t in legend.get_texts()]
    return {"panels": [{"title": ax.get_title(), "points": n} for ax, n in zip(axes, points)], "legend": labels,
            "outside": outside, "overlapping": overlapping}
