"""What the fine-tuning scripts save for users to publish holds no pickle: `FineTuningTrainer` writes the training
arguments as `training_args.json`, in the final folder and in every checkpoint, never `training_args.bin`."""

import json

import torch
from datasets import Dataset
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments


def test_fine_tuning_trainer_saves_json_training_arguments_and_no_pickle(tmp_path):
    from encoder_zoo.training.run import FineTuningTrainer

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=16))
    data = Dataset.from_dict({"input_ids": [[1, 5, 6, 2]] * 4, "labels": [0, 1, 0, 1]})
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, save_strategy="steps", save_steps=1,
                             per_device_train_batch_size=2, report_to="none", seed=7, hub_token="secret",
                             use_cpu=True)
    trainer = FineTuningTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    trainer.save_model()
    folders = [tmp_path / "out", tmp_path / "out" / "checkpoint-1", tmp_path / "out" / "checkpoint-2"]
    assert not list(tmp_path.rglob("training_args.bin"))
    for folder in folders:
        text = (folder / "training_args.json").read_text()
        saved = json.loads(text)
        assert saved["seed"] == 7 and saved["max_steps"] == 2 and saved["save_steps"] == 1
        assert "secret" not in text  # tokens are masked, as TrainingArguments.to_dict() does
