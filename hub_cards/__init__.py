"""Model cards generated from structured metadata (as timm's `_hub.py` does), never handwritten.

`write_card(CardMetadata(...), folder)` renders README.md with YAML front matter (library_name, license, tags,
datasets, pipeline_tag, base_model, model-index), the method and its citation, how to load the checkpoint with
`trust_remote_code=True`, training data and hyperparameters, the loss curve and other training figures, evaluation
results, intended use and limitations. `add_eval_results(folder, ...)` merges new results into an existing card's model-index and results table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

__all__ = ["CardMetadata", "write_card", "add_eval_results", "plot_loss_curve", "render_card", "display_name"]

_RESULTS_START, _RESULTS_END = "<!-- eval-results:start -->", "<!-- eval-results:end -->"

TEMPLATE = """---
{{ card_data }}
---

# {{ meta.model_name }}

{{ meta.summary }}

{% if meta.paper -%}
This checkpoint implements **{{ meta.paper.title }}** ({{ meta.paper.authors }}, {{ meta.paper.year }}, [{{ meta.paper.url }}]({{ meta.paper.url }})).
{%- endif %}

## How to load

The modeling code travels with the checkpoint, so loading needs `trust_remote_code=True` and nothing else:

```python
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{{ load_id }}", trust_remote_code=True)
model = AutoModel.from_pretrained("{{ load_id }}", trust_remote_code=True)
```
{% if not meta.repo_id %}
Replace `{{ load_id }}` with this checkpoint's Hub id once uploaded (or with the folder's path, to load it locally).
{% endif %}
The same folder loads through every Auto class listed in its `config.json` `auto_map`:
{% for auto_class, target in meta.auto_map.items() %}
- `{{ auto_class }}` -> `{{ target }}`
{%- endfor %}
{% if meta.peft_target_modules %}
LoRA with PEFT: PEFT keys its default `target_modules` by built-in model types, so name them:
`LoraConfig(target_modules={{ meta.peft_target_modules }}, task_type="SEQ_CLS")` (the classification head is
`classifier`, which PEFT then trains).
{% endif %}
## Architecture

| hyperparameter | value |
| --- | --- |
{% for key, value in meta.architecture.items() -%}
| {{ key }} | {{ value }} |
{% endfor %}
## Training

{{ meta.training_data }}

| setting | value |
| --- | --- |
{% for key, value in meta.training.items() -%}
| {{ key }} | {{ value }} |
{% endfor %}
{% if meta.optimisation -%}
Optimisation: the values this run used (read from its trainer), next to the paper's ({{ meta.optimisation_source }}).

| setting | this run | paper |
| --- | --- | --- |
{% for key, pair in meta.optimisation.items() -%}
| {{ key }} | {{ pair[0] }} | {{ pair[1] }} |
{% endfor %}
{%- endif %}
{% if meta.paper_hyperparameters -%}
The paper's other settings, for reference:

| setting | paper |
| --- | --- |
{% for key, value in meta.paper_hyperparameters.items() -%}
| {{ key }} | {{ value }} |
{% endfor %}
{%- endif %}
{% if meta.loss_curve -%}
![Training and validation loss]({{ meta.loss_curve }})
{%- endif %}
{% for caption, file in meta.figures %}
![{{ caption }}]({{ file }})
{% endfor %}

## Evaluation results

{{ results_start }}
{{ results_table }}
{{ results_end }}

## Intended use and limitations

{{ meta.intended_use }}
{% for item in meta.limitations %}
- {{ item }}
{%- endfor %}
{% if meta.paper %}
## Citation

```bibtex
{{ meta.paper.bibtex }}
```
{%- endif %}
"""


@dataclass
class CardMetadata:
    """Everything a card says, as data.

    `paper` is any object with `title`, `authors`, `year`, `url`, `bibtex` (e.g. `training.recipes.Paper`).
    `optimisation` maps a setting to (the value this run used, the paper's), shown side by side;
    `optimisation_source` names where the paper's values come from.
    `eval_results` holds dicts with the keyword arguments of `add_eval_results`.
    Nothing here may hold an absolute local path: the folder is meant for the Hub.
    """

    model_name: str
    summary: str
    auto_map: dict[str, str]
    repo_id: str | None = None  # the Hub id; None writes a placeholder, never a local path
    license: str = "apache-2.0"
    tags: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    pipeline_tag: str | None = None
    base_model: str | None = None
    peft_target_modules: list[str] | None = None  # LoRA's attention projections (PEFT has no default for them)
    paper: Any = None
    architecture: dict[str, Any] = field(default_factory=dict)
    training_data: str = ""
    training: dict[str, Any] = field(default_factory=dict)
    optimisation: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    optimisation_source: str = ""
    paper_hyperparameters: dict[str, Any] = field(default_factory=dict)
    loss_curve: str | None = None
    figures: list[tuple[str, str]] = field(default_factory=list)
    eval_results: list[dict[str, Any]] = field(default_factory=list)
    intended_use: str = (
        "A research checkpoint for studying pretraining objectives: fine-tune it (e.g. with this project's "
        "`glue/run_glue.py` or `qa/run_qa.py`) before using its predictions."
    )
    limitations: list[str] = field(default_factory=list)


def display_name(path_or_id: str) -> str:
    """A name a card may record: a Hub id as is, a local folder by its last two parts (no absolute local path)."""
    path = Path(path_or_id).expanduser()
    return "/".join(path.resolve().parts[-2:]) if path.exists() else path_or_id


def seeds_label(seeds: list[int] | None) -> str:
    """How many runs a number summarises, for the metric's pretty name: "seed 1" or "median of 3 seeds: 1, 2, 3"."""
    if not seeds:
        return ""
    if len(seeds) == 1:
        return f"1 seed: {seeds[0]}"
    return f"median of {len(seeds)} seeds: {', '.join(map(str, seeds))}"


def _eval_result(result: dict[str, Any], metric_type: str, value: float) -> EvalResult:
    label = seeds_label(result.get("seeds"))
    return EvalResult(
        task_type=result["task_type"],
        task_name=result.get("task_name"),
        dataset_type=result["dataset_type"],
        dataset_name=result["dataset_name"],
        dataset_config=result.get("dataset_config"),
        dataset_split=result.get("dataset_split"),
        metric_type=metric_type,
        metric_name=f"{metric_type} ({label})" if label else metric_type,
        metric_value=round(float(value), 4),
    )


def _results_table(results: list[EvalResult]) -> str:
    if not results:
        return "No evaluation results yet. `glue/run_glue.py --add_to_model_card` and `qa/run_qa.py` add them here."
    rows = ["| task | dataset | split | metric | value |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        rows.append(
            f"| {r.task_name or r.task_type} | {r.dataset_name} | {r.dataset_split or ''} | {r.metric_name} | {r.metric_value:.2f} |"
        )
    return "\n".join(rows)


def render_card(meta: CardMetadata) -> ModelCard:
    results = [_eval_result(r, name, value) for r in meta.eval_results for name, value in r["metrics"].items()]
    card_data = ModelCardData(
        library_name="transformers",
        license=meta.license,
        tags=sorted({*meta.tags, "custom_code", "pretraining-zoo"}),
        datasets=meta.datasets or None,
        pipeline_tag=meta.pipeline_tag,
        base_model=meta.base_model,
        model_name=meta.model_name,
        eval_results=results or None,
    )
    return ModelCard.from_template(
        card_data,
        template_str=TEMPLATE,
        meta=meta,
        load_id=meta.repo_id or f"<your-username>/{meta.model_name}",
        results_start=_RESULTS_START,
        results_end=_RESULTS_END,
        results_table=_results_table(results),
    )


def write_card(meta: CardMetadata, folder: str | Path) -> Path:
    path = Path(folder) / "README.md"
    render_card(meta).save(path)
    return path


def add_eval_results(
    model_dir: str | Path,
    *,
    task_type: str,
    task_name: str,
    dataset_name: str,
    dataset_type: str,
    metrics: dict[str, float],
    dataset_config: str | None = None,
    dataset_split: str | None = None,
    seeds: list[int] | None = None,
) -> Path:
    """Merge results into the card's model-index (replacing the same task/dataset/split/metric) and results table.

    Values are percentages (0-100), the scale of the Hub's leaderboards and of the official SQuAD scripts; callers
    convert fractions. `dataset_type` identifies the dataset: huggingface_hub groups and replaces results by it, so
    two datasets must never share one. `seeds` names the runs a value summarises (one seed, or the median of several).
    A folder without a card gets a minimal one, so fine-tuned outputs of any model can carry their results.
    """
    path = Path(model_dir) / "README.md"
    if path.exists():
        card = ModelCard.load(path)
    else:
        name = Path(model_dir).resolve().name
        card = ModelCard.from_template(ModelCardData(model_name=name), template_str=f"---\n{{{{ card_data }}}}\n---\n\n# {name}\n")
    new = [
        _eval_result(
            dict(task_type=task_type, task_name=task_name, dataset_name=dataset_name, dataset_type=dataset_type,
                 dataset_config=dataset_config, dataset_split=dataset_split, seeds=seeds),
            metric,
            value,
        )
        for metric, value in metrics.items()
    ]
    key = lambda r: (r.task_type, r.dataset_type, r.dataset_config, r.dataset_split, r.metric_type)  # noqa: E731
    replaced = {key(r) for r in new}
    existing = [r for r in (card.data.eval_results or []) if key(r) not in replaced]
    card.data.eval_results = existing + new
    if not card.data.model_name:
        card.data.model_name = Path(model_dir).resolve().name
    table = f"{_RESULTS_START}\n{_results_table(card.data.eval_results)}\n{_RESULTS_END}"
    if _RESULTS_START in card.text:
        card.text = re.sub(re.escape(_RESULTS_START) + r".*?" + re.escape(_RESULTS_END), lambda _: table, card.text, flags=re.S)
    else:
        card.text = card.text.rstrip() + "\n\n## Evaluation results\n\n" + table + "\n"
    card.save(path)
    return path


def plot_loss_curve(
    log_history: list[dict[str, Any]], path: str | Path, keys: tuple[str, ...] = ("loss",), ylabel: str = "loss"
) -> Path | None:
    """Draw the curves logged by Trainer (one line per key found: training logs and `eval_*` validation logs share
    the step axis) to a PNG; None when nothing was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {k: [(e["step"], e[k]) for e in log_history if k in e and "step" in e] for k in keys}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
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
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
