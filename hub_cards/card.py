"""Model cards rendered from `CardMetadata` with `huggingface_hub`, and model-index results added to them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from encoder_zoo.hub_cards.metadata import CardMetadata, seeds_label

_RESULTS_START, _RESULTS_END = "<!-- eval-results:start -->", "<!-- eval-results:end -->"


TEMPLATE = """---
{{ card_data }}
---

# {{ meta.model_name }}

{{ meta.summary }}

{% if meta.paper -%}
This checkpoint implements **{{ meta.paper.title }}** ({{ meta.paper.authors }}, {{ meta.paper.year }}, \
[{{ meta.paper.url }}]({{ meta.paper.url }})).
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
{%- for code in meta.carried_code %}
## Encoder code this checkpoint carries

The encoder is remote code, saved next to this model's own so the folder loads anywhere; loading runs it.

| encoder code | |
| --- | --- |
| files | {% for file in code.files %}`{{ file }}`{% if not loop.last %}, {% endif %}{% endfor %} |
| classes | {{ code.classes }}, from the module `{{ code.module }}` |
| copied from | `{{ code.source }}` |
| its `auto_map` | {% for auto_class, target in code.auto_map.items() -%}
`{{ auto_class }}` -> `{{ target }}`{{ ", " if not loop.last }}
{%- else %}none{% endfor %} |
| licence | {{ code.license }} |

This card's `license` covers this model's own code; the encoder's files and weights keep the encoder's licence.
{% endfor %}
## Architecture

| hyperparameter | value |
| --- | --- |
{% for key, value in meta.architecture.items() -%}
| {{ key }} | {{ value }} |
{% endfor %}
{% if meta.starting_weights -%}
## Starting weights

{{ meta.starting_weights }}

{% endif -%}
## Training

{{ meta.training_data }}

| setting | value |
| --- | --- |
{% for key, value in meta.training.items() -%}
| {{ key }} | {{ value }} |
{% endfor %}
{% if meta.optimisation -%}
Optimisation: the values this run used (read from its trainer),
next to the {{ meta.optimisation_reference }}'s ({{ meta.optimisation_source }}).

| setting | this run | {{ meta.optimisation_reference }} |
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
            f"| {r.task_name or r.task_type} | {r.dataset_name} | {r.dataset_split or ''} | {r.metric_name} "
            f"| {r.metric_value:.2f} |"
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
        card = ModelCard.from_template(ModelCardData(model_name=name),
                                       template_str=f"---\n{{{{ card_data }}}}\n---\n\n# {name}\n")
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
        card.text = re.sub(re.escape(_RESULTS_START) + r".*?" + re.escape(_RESULTS_END), lambda _: table, card.text,
                           flags=re.S)
    else:
        card.text = card.text.rstrip() + "\n\n## Evaluation results\n\n" + table + "\n"
    card.save(path)
    return path
