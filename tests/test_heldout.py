"""The held-out MLM loss and accuracy over the targets replaced by [MASK] only, beside the 80/10/10 mean."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from encoder_zoo import models
from encoder_zoo.training.recipes import get_recipe
from encoder_zoo.training.run.trainer import PretrainingTrainer

MASK = 4
VOCAB = 60


def tiny_model(recipe_name: str):
    recipe = get_recipe(recipe_name)
    config = models.get_class(recipe.family, "AutoConfig")(
        **recipe.sizes["tiny"], **recipe.config_overrides, vocab_size=VOCAB, max_position_embeddings=32,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return models.get_class(recipe.family, "AutoModelForPreTraining")(config).eval(), recipe


def known_batch():
    """Two rows of 10 tokens with 6 targets: 3 replaced by [MASK], 1 by another token, 2 left unchanged."""
    input_ids = torch.tensor([[1, 11, MASK, 13, 14, MASK, 16, 17, 18, 2],
                              [1, 21, 22, 23, 50, 25, MASK, 27, 28, 2]])
    labels = torch.full_like(input_ids, -100)
    labels[0, 2], labels[0, 5], labels[1, 6] = 12, 15, 26  # at [MASK]
    labels[1, 4] = 24  # replaced by a random token (50)
    labels[0, 3], labels[1, 8] = 13, 28  # left unchanged: the model may copy them
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def evaluate(model, recipe, batch, tmp_path, mask_token_id=MASK) -> dict:
    from transformers import TrainingArguments

    rows = [{name: tensor[i] for name, tensor in batch.items()} for i in range(batch["input_ids"].shape[0])]
    trainer = PretrainingTrainer(
        model=model, args=TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to=[],
                                            use_cpu=True),
        eval_dataset=rows, data_collator=lambda rows: {k: torch.stack([row[k] for row in rows]) for k in rows[0]},
        processing_class=SimpleNamespace(mask_token_id=mask_token_id), logged_outputs=recipe.logged_outputs)
    return trainer.evaluate()


def test_only_the_masked_targets_count(tmp_path):
    model, recipe = tiny_model("bert")
    batch = known_batch()
    with torch.no_grad():  # logits at every position, read by hand at the [MASK]ed targets only
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).mlm_logits.float()
    masked = (batch["labels"] != -100) & (batch["input_ids"] == MASK)
    assert masked.sum() == 3 and (batch["labels"] != -100).sum() == 6
    loss = F.cross_entropy(logits[masked], batch["labels"][masked])
    hits = (logits[masked].argmax(-1) == batch["labels"][masked]).float().mean()
    every = F.cross_entropy(logits[batch["labels"] != -100], batch["labels"][batch["labels"] != -100])

    metrics = evaluate(model, recipe, batch, tmp_path)
    assert metrics["eval_mlm_masked_targets"] == 3
    assert metrics["eval_mlm_masked_loss"] == pytest.approx(loss.item(), abs=1e-4)
    assert metrics["eval_mlm_masked_accuracy"] == pytest.approx(hits.item(), abs=1e-4)
    assert metrics["eval_mlm_loss"] == pytest.approx(every.item(), abs=1e-4)  # the 80/10/10 mean stays as it was
    assert abs(metrics["eval_mlm_masked_loss"] - metrics["eval_mlm_loss"]) > 1e-3

    # Another token as [MASK]: no target is masked any more, so no masked-only figure is reported
    assert "eval_mlm_masked_loss" not in evaluate(model, recipe, batch, tmp_path, mask_token_id=VOCAB - 1)


def test_the_teams_generator_reports_its_masked_only_loss(tmp_path):
    """TEAMS's generator: where every target is [MASK]ed, the masked-only figures are its own mlm_loss and accuracy."""
    model, recipe = tiny_model("teams")
    batch = known_batch()
    targets = batch["labels"] != -100
    batch["input_ids"] = batch["input_ids"].masked_fill(targets, MASK)
    metrics = evaluate(model, recipe, batch, tmp_path)
    assert metrics["eval_mlm_masked_targets"] == 6
    assert metrics["eval_mlm_masked_loss"] == pytest.approx(metrics["eval_mlm_loss"], abs=2e-4)
    assert metrics["eval_mlm_masked_accuracy"] == pytest.approx(metrics["eval_mlm_accuracy"], abs=2e-4)


def test_the_card_heads_its_held_out_rows_with_the_masked_only_figures():
    from encoder_zoo.training.run.export import validation_rows

    rows = validation_rows({"eval_loss": 6.3, "eval_mlm_loss": 6.26, "eval_mlm_ppl": 523.0, "eval_mlm_masked_loss": 6.8,
                            "eval_mlm_masked_accuracy": 0.05, "eval_mlm_masked_targets": 4321, "eval_runtime": 1.0})
    assert list(rows) == ["validation MLM loss at [MASK]ed targets only, nats (the headline: tokens predicted unseen)",
                          "validation MLM top-1 accuracy at [MASK]ed targets only, points",
                          "validation [MASK]ed targets scored", "validation loss",
                          "validation MLM loss over all 80/10/10 targets, nats (a tenth left unchanged: copied, not "
                          "predicted)", "validation MLM perplexity over all 80/10/10 targets"]
    assert list(rows.values()) == [6.8, 5.0, 4321, 6.3, 6.26, 523.0]  # an accuracy in points, as every score shown
    assert validation_rows({"eval_rtd_accuracy": 0.9125})["validation rtd_accuracy, points"] == 91.25
    cloze = validation_rows({"eval_loss": 5.0, "eval_cloze_loss": 5.0})
    assert "validation cloze loss, nats (every token predicted from both sides without seeing it)" in cloze


def test_the_bigram_floor_on_a_hand_counted_corpus():
    """Ids: 0 [PAD], 1 [CLS], 2 [SEP] (special), 3 a, 4 b, 5 c; 6 the sequences' boundary. The counts below are
    counted by hand from the three training sequences, the expected loss worked from them by the formula."""
    import math
    from fractions import Fraction as Q

    from encoder_zoo.repro.floors import bigram_loss

    train = [[1, 3, 4, 2], [1, 3, 5, 2], [1, 4, 3, 4, 2]]  # [CLS] a b [SEP]; [CLS] a c [SEP]; [CLS] b a b [SEP]
    held_out = [[1, 3, 4, 2], [1, 5, 5, 2]]  # targets: a ([CLS] _ b), b (a _ [SEP]), c ([CLS] _ c), c (c _ [SEP])
    pairs = {(6, 1): 3, (1, 3): 2, (1, 4): 1, (3, 4): 2, (3, 5): 1, (4, 2): 2, (4, 3): 1, (5, 2): 1, (2, 6): 3}
    u = {3: Q(3 + 1, 10), 4: Q(3 + 1, 10), 5: Q(1 + 1, 10)}  # a 3, b 3, c 1 in training, + 1 each (Laplace)
    v = {i: Q(n + 1, 13 + 7) for i, n in enumerate([0, 3, 3, 3, 3, 1, 0])}  # every id's count + 1, 7 ids

    def p_left(w, before):  # Witten-Bell: (c(l, w) + n(l) u(w)) / (c(l) + n(l)), over the target tokens a, b, c
        seen = {x: n for (a, x), n in pairs.items() if a == before and x in u}
        c, n = sum(seen.values()), len(seen)
        return u[w] if not c else (seen.get(w, 0) + n * u[w]) / (c + n)

    def p_right(after, w):  # the same over every following id, with v
        seen = {x: n for (a, x), n in pairs.items() if a == w}
        c, n = sum(seen.values()), len(seen)
        return v[after] if not c else (seen.get(after, 0) + n * v[after]) / (c + n)

    def p(w, before, after):
        return p_left(w, before) * p_right(after, w) / sum(p_left(x, before) * p_right(after, x) for x in u)

    assert p_left(3, 1) == Q(2 + 2 * Q(4, 10), 3 + 2)  # after [CLS]: a twice, b once (2 distinct)
    assert p_right(4, 3) == Q(2 + 2 * v[4], 3 + 2)  # after a: b twice, c once
    assert p_left(5, 5) == u[5]  # nothing follows c but [SEP], no target: the unigram
    targets = [(3, 1, 4), (4, 3, 2), (5, 1, 5), (5, 5, 2)]
    expected = -sum(math.log(p(*t)) for t in targets) / len(targets)
    assert bigram_loss(train, held_out, 6, [0, 1, 2]) == pytest.approx(expected, rel=1e-12)
    # what the model adds: a from [CLS] _ b is likelier than its frequency alone says
    assert p(3, 1, 4) > u[3]
