"""Generated model cards: front matter, sections, loss curve, model-index merging, upload call."""

import yaml
from huggingface_hub import ModelCard

from encoder_zoo.hub_cards import CardMetadata, add_eval_results, plot_loss_curve, write_card
from encoder_zoo.training.recipes import get_recipe


def front_matter(path):
    return yaml.safe_load(path.read_text().split("---")[1])


def make_card(tmp_path):
    recipe = get_recipe("spanbert")
    curve = plot_loss_curve([{"step": s, "loss": 10 - s / 10, "mlm_loss": 5 - s / 20} for s in range(0, 50, 10)],
                            tmp_path / "loss_curve.png", keys=("loss", "mlm_loss"))
    meta = CardMetadata(
        model_name="spanbert-tiny",
        summary=recipe.summary,
        auto_map={"AutoModel": "modeling_spanbert.SpanBertModel"},
        repo_id="someone/spanbert-tiny",
        tags=["spanbert"],
        datasets=["wikipedia"],
        pipeline_tag="feature-extraction",
        paper=recipe.paper,
        architecture={"hidden_size": 128},
        training_data="Wikipedia.",
        training={"steps": 40},
        optimisation={"peak learning rate": ("0.0003", "0.0001")},
        optimisation_source="SpanBERT Sec. 4 (base model)",
        paper_hyperparameters=recipe.hyperparameters,
        loss_curve=curve.name,
        peft_target_modules=["query", "value"],
        limitations=["Tiny."],
    )
    return write_card(meta, tmp_path)


def test_card_has_front_matter_and_every_section(tmp_path):
    path = make_card(tmp_path)
    meta = front_matter(path)
    assert meta["library_name"] == "transformers" and meta["license"] == "apache-2.0"
    assert {"spanbert", "custom_code"} <= set(meta["tags"]) and meta["datasets"] == ["wikipedia"]
    text = path.read_text()
    for needle in ("## How to load", 'AutoModel.from_pretrained("someone/spanbert-tiny", trust_remote_code=True)',
                   "| hidden_size | 128 |", "| steps | 40 |",
                   "| setting | this run | paper |", "| peak learning rate | 0.0003 | 0.0001 |",
                   "(SpanBERT Sec. 4 (base model))", "The paper's other settings", "| dropout | 0.1 on all layers",
                   "![Training and validation loss](loss_curve.png)",
                   """LoraConfig(target_modules=['query', 'value'], task_type="SEQ_CLS")""",
                   "## Evaluation results", "## Intended use and limitations", "- Tiny.", "@article{joshi2020spanbert"):
        assert needle in text, needle
    assert (tmp_path / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_how_to_load_names_a_placeholder_without_a_hub_id_and_plots_show_validation(tmp_path):
    write_card(CardMetadata(model_name="teams-tiny", summary="s", auto_map={}), tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert 'AutoModel.from_pretrained("<your-username>/teams-tiny", trust_remote_code=True)' in text
    assert "Replace `<your-username>/teams-tiny` with this checkpoint's Hub id" in text and str(tmp_path) not in text
    # Validation logs (sparse eval_* entries) share the step axis with the training logs.
    import matplotlib.image

    log = [{"step": s, "loss": 5 - s / 10} for s in range(1, 11)] + [{"step": 5, "eval_loss": 4.6},
                                                                      {"step": 10, "eval_loss": 4.2}]
    drawn = plot_loss_curve(log, tmp_path / "curve.png", keys=("loss", "eval_loss"))
    assert drawn and matplotlib.image.imread(drawn).shape[-1] in (3, 4)
    assert plot_loss_curve(log, tmp_path / "none.png", keys=("rtd_accuracy",)) is None


def test_add_eval_results_merges_into_model_index_and_table(tmp_path):
    path = make_card(tmp_path)
    add_eval_results(tmp_path, task_type="text-classification", task_name="SST-2", dataset_name="GLUE SST-2",
                     dataset_type="nyu-mll/glue", dataset_config="sst2", dataset_split="validation",
                     metrics={"accuracy": 0.81})
    add_eval_results(tmp_path, task_type="question-answering", task_name="SQuAD", dataset_name="SQuAD",
                     dataset_type="rajpurkar/squad", metrics={"exact_match": 50.0, "f1": 60.0})
    # Re-running the same evaluation replaces its number instead of duplicating it.
    add_eval_results(tmp_path, task_type="text-classification", task_name="SST-2", dataset_name="GLUE SST-2",
                     dataset_type="nyu-mll/glue", dataset_config="sst2", dataset_split="validation",
                     metrics={"accuracy": 0.83})
    card = ModelCard.load(path)
    results = {(r.dataset_type, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert results == {("nyu-mll/glue", "accuracy"): 0.83, ("rajpurkar/squad", "exact_match"): 50.0,
                       ("rajpurkar/squad", "f1"): 60.0}
    index = front_matter(path)["model-index"][0]
    assert index["name"] == "spanbert-tiny" and len(index["results"]) == 2
    text = path.read_text()
    assert "| SST-2 | GLUE SST-2 | validation | accuracy | 0.83 |" in text and "0.81 |" not in text
    assert "## How to load" in text  # the rest of the card is untouched


def test_add_eval_results_creates_a_card_for_any_folder(tmp_path):
    add_eval_results(tmp_path, task_type="text-classification", task_name="rotten_tomatoes", dataset_name="RT",
                     dataset_type="local", metrics={"accuracy": 0.8})
    assert front_matter(tmp_path / "README.md")["model-index"][0]["results"][0]["metrics"][0]["value"] == 0.8


def test_results_keep_their_dataset_split_metric_and_seeds_through_huggingface_hub_parsers(tmp_path):
    """Two embedded datasets with the same metric both survive, each under its own dataset; every result names its
    dataset, split, metric and seeds; huggingface_hub's own parsers read the card back to the same results."""
    from huggingface_hub import ModelCardData
    from huggingface_hub.repocard_data import model_index_to_eval_results

    for task, metrics in (("rotten_tomatoes", {"accuracy": 81.0}), ("other_sentiment", {"accuracy": 66.0}),
                          ("movie_sentiment_regression", {"pearson": 50.0, "spearmanr": 48.0})):
        add_eval_results(tmp_path, task_type="text-classification", task_name=task, dataset_name=task,
                         dataset_type=f"encoder-zoo:{task}", dataset_split="validation", metrics=metrics,
                         seeds=[1, 2, 3])
    meta = front_matter(tmp_path / "README.md")
    name, parsed = model_index_to_eval_results(meta["model-index"])
    assert name == tmp_path.name
    values = {(r.dataset_type, r.metric_type): r.metric_value for r in parsed}
    assert values == {("encoder-zoo:rotten_tomatoes", "accuracy"): 81.0,
                      ("encoder-zoo:other_sentiment", "accuracy"): 66.0,
                      ("encoder-zoo:movie_sentiment_regression", "pearson"): 50.0,
                      ("encoder-zoo:movie_sentiment_regression", "spearmanr"): 48.0}
    for r in parsed:
        assert r.dataset_split == "validation" and r.dataset_name == r.task_name
        assert r.metric_name == f"{r.metric_type} (median of 3 seeds: 1, 2, 3)"
    grouped = {entry["dataset"]["type"]: [m["type"] for m in entry["metrics"]]
               for entry in meta["model-index"][0]["results"]}
    assert grouped["encoder-zoo:movie_sentiment_regression"] == ["pearson", "spearmanr"] and len(grouped) == 3
    card_data = ModelCardData(**meta)
    assert (len(card_data.eval_results) == 4
            and ModelCard.load(tmp_path / "README.md").data.eval_results == card_data.eval_results)


def test_push_export_uploads_the_folder(tmp_path, monkeypatch):
    import huggingface_hub

    from encoder_zoo.training.run.export import push_export

    calls = []

    class FakeApi:
        def __init__(self, token=None):
            calls.append(("init", token))

        def create_repo(self, repo_id, exist_ok, private):
            calls.append(("create", repo_id, exist_ok))

        def upload_folder(self, folder_path, repo_id, commit_message):
            calls.append(("upload", folder_path, repo_id))
            return "commit-url"

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    assert push_export(tmp_path, "me/model", token="t") == "commit-url"
    assert calls == [("init", "t"), ("create", "me/model", True), ("upload", str(tmp_path), "me/model")]


def test_loss_curve_legend_covers_no_curve_and_names_each_curve_once():
    """The demo's loss curve: every logged key one line and one legend entry, the legend beside the axes (it covered
    the training curve when drawn inside them)."""
    from encoder_zoo.hub_cards.plots import loss_curve_figure

    log = [{"step": s, "loss": 18 - s / 10, "mlm_loss": 9 - s / 20, "sbo_loss": 9 - s / 21} for s in range(10, 110, 10)]
    log += [{"step": 100, "eval_loss": 14.7, "eval_mlm_loss": 7.37, "eval_sbo_loss": 7.38,
             "eval_mlm_masked_loss": 7.36}]
    keys = ("loss", "eval_loss", "mlm_loss", "sbo_loss", "eval_mlm_loss", "eval_sbo_loss", "eval_mlm_masked_loss")
    figure = loss_curve_figure(log, keys)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    [ax] = figure.axes
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == list(keys) and len(ax.get_lines()) == len(keys)
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    assert legend.get_window_extent(renderer).x1 <= figure.bbox.x1 + 1  # inside the figure, not cut off
