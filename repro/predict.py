"""The evaluation rows' predictions of fine-tuned sentence-task models: glue/run_glue.py records each seed's scores and
saves its model, not its predictions, so this reads each saved model again and predicts the same rows (the task's
first --max_eval_samples, tokenized as run_glue.py does). A report uses them to say on what fraction of the rows two
arms with the same scores answer differently.

    python repro/predict.py --task rotten_tomatoes --max_seq_length 128 --max_eval_samples 500 \\
        --models RUN/rotten_tomatoes/seed-101 ... --names seed-101 ... --output_dir OUT

Writes OUT/<name>.json per model: the task, the rows, each row's prediction (a label, or a regression value) and the
score they give (which should be the fine-tuning's own: `score` beside the recorded one tells if not).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path


def predict(task_name: str, model_dir: Path, max_seq_length: int, max_eval_samples: int | None) -> dict:
    import numpy as np
    from scipy import stats
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from encoder_zoo.glue.tasks import first_samples, load_task
    from encoder_zoo.training.run import extra_inputs_for, load_pretrained, pin_memory_only_with_an_accelerator

    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"--models {model_dir}: no saved model there (config.json)")
    task, raw = load_task(task_name)
    split = task.validation_splits[0]
    rows = first_samples(raw, task, None, max_eval_samples)[split]
    tokenizer = load_pretrained(AutoTokenizer, str(model_dir), trust_remote_code=True)
    extra_inputs = extra_inputs_for(load_pretrained(AutoConfig, str(model_dir), trust_remote_code=True))

    def tokenize(batch):  # as run_glue.py's run_task
        texts = [batch[column] for column in task.text_columns]
        encoded = tokenizer(*texts, truncation=True, max_length=max_seq_length,
                            return_offsets_mapping=extra_inputs is not None)
        if extra_inputs is not None:
            encoded.update(extra_inputs(encoded, texts))
            encoded.pop("offset_mapping")
        return encoded

    encoded = rows.map(tokenize, batched=True, remove_columns=rows.column_names)
    model = load_pretrained(AutoModelForSequenceClassification, str(model_dir), trust_remote_code=True)
    with tempfile.TemporaryDirectory() as scratch:
        arguments = TrainingArguments(output_dir=scratch, per_device_eval_batch_size=64, report_to="none",
                                      disable_tqdm=True)
        pin_memory_only_with_an_accelerator(arguments)  # as run_glue.py: no pin_memory warning on a CPU
        trainer = Trainer(model=model, args=arguments, data_collator=DataCollatorWithPadding(tokenizer))
        logits = trainer.predict(encoded).predictions
    logits = logits[0] if isinstance(logits, tuple) else logits
    labels = np.asarray(rows["label"])
    if task.is_regression:
        predicted = np.squeeze(logits, -1).astype(float)
        score = {"pearson": float(stats.pearsonr(predicted, labels)[0])}
    else:
        predicted = np.argmax(logits, axis=-1).astype(int)
        score = {"accuracy": float(np.mean(predicted == labels))}
    return {"task": task_name, "split": split, "rows": len(rows), "model": str(model_dir),
            "predictions": predicted.tolist(), "score": score}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True)
    parser.add_argument("--max_seq_length", type=int, required=True)
    parser.add_argument("--max_eval_samples", type=int)
    parser.add_argument("--models", nargs="+", required=True, help="Saved fine-tuned models.")
    parser.add_argument("--names", nargs="+", required=True, help="One output name per model.")
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)
    if len(args.names) != len(args.models):
        parser.error(f"{len(args.models)} --models but {len(args.names)} --names: give one name per model")
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    made = []
    for model, name in zip(args.models, args.names):
        result = predict(args.task, Path(model), args.max_seq_length, args.max_eval_samples)
        staged = output / f".{name}.json.{os.getpid()}"  # whole or not at all
        staged.write_text(json.dumps(result))
        os.replace(staged, output / f"{name}.json")
        print(f"{name}: {result['rows']} rows, {result['score']}")
        made.append(result)
    return made


def cli() -> None:
    from encoder_zoo.training.run.entry import run_cli

    run_cli(main, "predict.py")


if __name__ == "__main__":
    cli()
