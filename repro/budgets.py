"""The declared compute budgets: one preset per budget, shared by every experiment."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """Everything a budget fixes. Pretraining uses each recipe's own optimiser and schedule at `model_size` (the
    paper's; at `tiny`, which no paper trains, the paper's optimiser at its own rate: `TrainingDefaults.for_tiny`);
    the budget sets only size, length of the run, batch and data, the same for every arm of an experiment."""

    name: str
    description: str
    model_size: str  # --model_size for spanbert/bert/teams/electra/cloze
    pretrain_steps: int
    pretrain_batch_size: int  # per device; no gradient accumulation (the recipes would accumulate to the paper's batch)
    max_seq_length: int
    max_documents: int | None  # of the pretraining corpus
    validation_documents: int  # held out: the held-out MLM loss
    tokenizer_vocab_size: int
    cnn_size: str  # BERTAC's CNN (--model bertac_cnn --model_size)
    cnn_steps: int
    cnn_documents: int | None
    cnn_batch_size: int
    # The unit of replication is one independently trained model: a pretraining seed of a pretrained arm, an
    # initialisation seed of a fusion's new layers (with, for BERTAC, its CNN's pretraining seed), a fine-tuning
    # seed of the plain backbone. Every arm trains one model per unit seed; fine-tuning seeds within a unit measure
    # that model more precisely and are averaged, never counted as units (repro/stats.py). An experiment may set its
    # own count per budget (`Experiment.budget_units`).
    unit_seeds: tuple[int, ...]
    finetune_seeds: tuple[int, ...]  # within a unit; the seed run is `finetune_seed(unit, seed)`
    finetune_epochs: float | None  # None: each experiment's fine-tuning preset's own (the paper's)
    # An encoder of ours fine-tunes at this rate (None: the preset's, the paper's). The papers' 1e-5 to 1e-4 move a
    # large encoder over thousands of steps; a tiny one over a few hundred stays at the majority class
    # (repro/reports/tuning). Every arm of a comparison, the positive control included, gets the same rate.
    finetune_learning_rate: float | None
    # Arms over the offline MiniLM (HIRE, BERTAC): it learns the tasks in 2 epochs, and their presets' 8-10 epochs
    # would take hours on a CPU.
    minilm_finetune_epochs: float | None
    # ...and their training examples (None: max_train_samples): HIRE's GRU fusion steps 3.8x slower than MiniLM alone
    # on a CPU (bench/results/hire.json), BERTAC's TIER 1.6x.
    minilm_max_train_samples: int | None
    # ...and their learning rate (None: the preset's, the paper's). The papers' 1e-5 moves a large encoder over
    # thousands of steps; over MiniLM's 63 steps of 1,000 rows x 2 epochs it leaves even the plain MiniLM at the
    # majority class (rotten_tomatoes 0.572, training loss 0.689), where 5e-5 reaches 0.722 and 1e-4 0.758
    # (docs/reproduction.md). Every arm of a comparison gets the same rate.
    minilm_learning_rate: float | None
    finetune_batch_size: int
    finetune_max_seq_length: int
    max_train_samples: int | None
    max_eval_samples: int | None
    tasks: tuple[str, ...]  # evaluation tasks allowed at this budget (intersected with the experiment's)
    bf16: bool = False
    # Continued pretraining (the `adapt` budget): every pretraining continues this encoder ("minilm": the shipped
    # MiniLM, `training.run.minilm_path()`) with its own objective (`pretrain.py --init_from`), whose architecture and
    # tokenizer come from it: `model_size` then only names the size preset whose training defaults the run keeps
    # (MiniLM's nearest, `small`), and `tokenizer_vocab_size` is unused. None: every pretraining starts from random.
    init_from: str | None = None
    # Sentence tasks whose training sentences (labels unused) are the pretraining text of every arm
    # (`repro.tasks.pretraining_text`): task-adaptive pretraining (Gururangan et al. 2020). (): Wikipedia.
    pretrain_text: tuple[str, ...] = ()
    # A continued pretraining's peak rate and warmup, the same for every arm (None: the recipe's at `model_size`).
    pretrain_learning_rate: float | None = None
    pretrain_warmup_steps: int | None = None
    # What a report at this budget tests, where it is not the papers' own runs (shown above its scores and in README).
    tests_what: str = ""
    # How BERTAC's CNN is pretrained here, where that differs from what `description` says: added to the budget line
    # of a report that trains the CNN only (`description_for`).
    cnn_description: str = ""

    def description_for(self, trains_cnn: bool) -> str:
        """The budget line of a report: `description`, and how BERTAC's CNN is pretrained where the report trains it."""
        return f"{self.description}; {self.cnn_description}" if trains_cnn and self.cnn_description else \
            self.description

    @staticmethod
    def finetune_seed(unit: int, seed: int) -> int:
        """The fine-tuning seed of `unit`'s `seed`-th run: distinct across units, so that even a fixed backbone's
        units are different models; shared by the arms' units of one seed, so that they pair."""
        return 100 * unit + seed

    def starting_weights(self) -> str | None:
        """The checkpoint every pretraining continues (`init_from` resolved), or None."""
        if self.init_from is None:
            return None
        if self.init_from != "minilm":
            raise ValueError(f"budget {self.name}: init_from {self.init_from!r} is not 'minilm'")
        from encoder_zoo.training.run import minilm_path

        return str(minilm_path())

    def pretrain_flags(self) -> list[str]:
        if self.init_from:  # size and tokenizer from the checkpoint (a --model_size that disagreed would be refused)
            return ["--init_from", self.starting_weights(), "--max_steps", str(self.pretrain_steps),
                    "--per_device_train_batch_size", str(self.pretrain_batch_size), "--gradient_accumulation_steps",
                    "1", "--max_seq_length", str(self.max_seq_length),
                    "--validation_documents", str(self.validation_documents),
                    *(["--max_documents", str(self.max_documents)] if self.max_documents else []),
                    *(["--learning_rate", str(self.pretrain_learning_rate)] if self.pretrain_learning_rate else []),
                    *(["--bf16", "true"] if self.bf16 else [])]
        return ["--model_size", self.model_size, "--max_steps", str(self.pretrain_steps),
                "--per_device_train_batch_size", str(self.pretrain_batch_size), "--gradient_accumulation_steps", "1",
                "--max_seq_length", str(self.max_seq_length), "--tokenizer_vocab_size", str(self.tokenizer_vocab_size),
                "--validation_documents", str(self.validation_documents),
                *(["--max_documents", str(self.max_documents)] if self.max_documents else []),
                *(["--bf16", "true"] if self.bf16 else [])]

    def cnn_flags(self) -> list[str]:
        return ["--model", "bertac_cnn", "--model_size", self.cnn_size, "--max_steps", str(self.cnn_steps),
                "--per_device_train_batch_size", str(self.cnn_batch_size), "--validation_documents", "0",
                *(["--max_documents", str(self.cnn_documents)] if self.cnn_documents else [])]

    def train_samples(self, over_minilm: bool = False) -> int | None:
        """The training rows a fine-tuning reads (None: all): over the MiniLM, or over an encoder of ours."""
        return (self.minilm_max_train_samples or self.max_train_samples) if over_minilm else self.max_train_samples

    def finetune_flags(self, over_minilm: bool = False) -> list[str]:
        epochs = self.minilm_finetune_epochs if over_minilm else self.finetune_epochs
        train_samples = self.train_samples(over_minilm)
        learning_rate = self.minilm_learning_rate if over_minilm else self.finetune_learning_rate
        return [*(["--num_train_epochs", str(epochs)] if epochs is not None else []),
                *(["--learning_rate", str(learning_rate)] if learning_rate is not None else []),
                "--per_device_train_batch_size", str(self.finetune_batch_size),
                "--max_seq_length", str(self.finetune_max_seq_length),
                *(["--max_train_samples", str(train_samples)] if train_samples else []),
                *(["--max_eval_samples", str(self.max_eval_samples)] if self.max_eval_samples else []),
                *(["--bf16", "true"] if self.bf16 else [])]


# The pretraining metrics (held-out token-prediction losses, no fine-tuning) cost nothing beyond the pretraining.
HELDOUT = ("heldout_mlm_masked", "heldout_mlm", "heldout_cloze", "heldout_bilm")
ALL_TASKS = ("rotten_tomatoes", "movie_sentiment_regression", "wiki_cloze", "wiki_cloze_v2", *HELDOUT)

# The `adapt` budget's continued-pretraining steps (the arithmetic: docs/reproduction.md, "The adapt budget").
ADAPT_STEPS = 140
ADAPT_TESTS = ("the paper's objective as a continued-pretraining step on a pretrained encoder (the shipped MiniLM, "
               "task-adaptive), not the paper's from-scratch run")

BUDGETS = {
    "smoke": Budget(
        name="smoke", description="plumbing only: tiny models, 10 pretraining steps, 32 fine-tuning examples; "
        "its numbers mean nothing", model_size="tiny", pretrain_steps=10, pretrain_batch_size=4, max_seq_length=64,
        max_documents=120, validation_documents=10, tokenizer_vocab_size=1000, cnn_size="tiny", cnn_steps=6,
        cnn_documents=6, cnn_batch_size=16, unit_seeds=(1, 2), finetune_seeds=(1,), finetune_epochs=1,
        finetune_learning_rate=None, minilm_finetune_epochs=1, minilm_max_train_samples=None, minilm_learning_rate=None,
        finetune_batch_size=8,
        finetune_max_seq_length=48, max_train_samples=32, max_eval_samples=32,
        tasks=("rotten_tomatoes", *HELDOUT)),
    "cpu": Budget(
        name="cpu", description="tiny models, 4,000 pretraining steps of 16 x 128 tokens on 3,000 Wikipedia "
        "documents (cloze 2,000: Experiment.budget_steps) at the tiny size's rate (1e-3, 5% warmup; cloze its paper's "
        "SGD), chosen on held-out loss against "
        "the unigram floor (docs/reproduction.md); 5 units (independently trained models) per arm where a "
        "pretraining takes under 10 minutes, else 3 (Experiment.budget_units), one fine-tuning run each, 3 epochs at "
        "3e-4; about 1.5 hours per paper on 2 CPU cores, each report giving its measured time",
        model_size="tiny", pretrain_steps=4000, pretrain_batch_size=16, max_seq_length=128, max_documents=3000,
        validation_documents=100, tokenizer_vocab_size=8000, cnn_size="tiny", cnn_steps=400, cnn_documents=60,
        cnn_batch_size=64, unit_seeds=(1, 2, 3, 4, 5), finetune_seeds=(1,), finetune_epochs=3,
        finetune_learning_rate=3e-4, minilm_finetune_epochs=2, minilm_max_train_samples=1000, minilm_learning_rate=1e-4,
        finetune_batch_size=32,
        finetune_max_seq_length=128, max_train_samples=2000, max_eval_samples=500,
        tasks=("rotten_tomatoes", "movie_sentiment_regression", "wiki_cloze", *HELDOUT)),
    # Each paper's objective as a continued-pretraining step on the shipped MiniLM, on the evaluation task's
    # own training sentences; the steps sized from measured per-step costs to fit 2 hours with --jobs 2 on 2 cores
    # (docs/reproduction.md, "The adapt budget"). Its arms and controls: `Experiment.adapted`.
    "adapt": Budget(
        name="adapt", description="the shipped MiniLM (6 layers, 384 wide) continued with each arm's own objective "
        f"for {ADAPT_STEPS} steps of 32 sentences (at most 128 tokens) at 1e-4 (warmup 10) on rotten_tomatoes' 11,476 "
        "training sentences, labels unused (task-adaptive pretraining), then fine-tuned as the MiniLM arms are (1,000 "
        "rows, 2 epochs at 1e-4); 5 units (continued-pretraining seeds) per arm; controls: MiniLM > its random "
        "initialisation, and MiniLM continued with plain MLM > MiniLM fine-tuned directly; sized to about 2 hours "
        "per paper with --jobs 2 on 2 CPU cores from measured per-step costs (docs/reproduction.md)",
        cnn_description="BERTAC's CNN (the zoo's) as at `cpu`",
        model_size="small", pretrain_steps=ADAPT_STEPS, pretrain_batch_size=32, max_seq_length=128,
        max_documents=None, validation_documents=200, tokenizer_vocab_size=0, cnn_size="tiny", cnn_steps=400,
        cnn_documents=60, cnn_batch_size=64, unit_seeds=(1, 2, 3, 4, 5), finetune_seeds=(1,), finetune_epochs=None,
        finetune_learning_rate=None, minilm_finetune_epochs=2, minilm_max_train_samples=1000,
        minilm_learning_rate=1e-4, finetune_batch_size=32, finetune_max_seq_length=128, max_train_samples=None,
        max_eval_samples=500, tasks=("rotten_tomatoes", *HELDOUT), init_from="minilm",
        pretrain_text=("rotten_tomatoes",), pretrain_learning_rate=1e-4, pretrain_warmup_steps=10,
        tests_what=ADAPT_TESTS),
    # What fits one lent GPU session (HIRE's primary and control, via Experiment.budget_arms), and how its time was
    # estimated: docs/reproduction.md, "Budgets".
    "gpu": Budget(
        name="gpu", description="one H100/H200 in bf16, not yet run: small models, 10,000 pretraining steps of "
        "128 x 128 tokens on the 10k embedded Wikipedia documents (hours per pretrained experiment); the MiniLM "
        "arms over every training row, 3 epochs at 1e-4; 5 units (independently trained models) per arm, one "
        "fine-tuning run each; HIRE's primary claim and its control are estimated at 4-6 minutes with --jobs 6",
        model_size="small",
        pretrain_steps=10_000, pretrain_batch_size=128, max_seq_length=128, max_documents=None,
        validation_documents=200, tokenizer_vocab_size=16000,
        cnn_size="w123-f100", cnn_steps=2000, cnn_documents=None, cnn_batch_size=4000, unit_seeds=(1, 2, 3, 4, 5),
        finetune_seeds=(1,), finetune_epochs=3, finetune_learning_rate=None, minilm_finetune_epochs=3,
        minilm_max_train_samples=None,
        minilm_learning_rate=1e-4, finetune_batch_size=32, finetune_max_seq_length=128, max_train_samples=None,
        max_eval_samples=None, tasks=ALL_TASKS, bf16=True),
}


# Arms a continued-pretraining budget names after a method but that continue its encoder, where the name alone reads
# as another model: `bert` there is MiniLM continued with plain MLM, not Google's BERT. What reports and README show.
CONTINUED_LABELS = {"bert": "bert (MiniLM + MLM)"}


def arm_label(name: str, results: dict) -> str:
    """`name` as reports and README show it: at a continued-pretraining budget (`Budget.init_from`), with what it
    continues (`CONTINUED_LABELS`)."""
    return CONTINUED_LABELS.get(name, name) if (results.get("budget") or {}).get("init_from") else name


# ------------------------------------------------------------------------------ the commands' seeds (run.py, tune.py)
class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose refusals are one line (`tune.py adapt: error: ...`, exit status 2), without the usage
    block: every unit, seed, grid entry and rate is checked before any job runs."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def unit_seed(text: str) -> int:
    """A unit or fine-tuning seed from the command line: a whole number from 0."""
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if seed < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is no seed: give whole numbers from 0")
    return seed


def refuse_repeats(parser: argparse.ArgumentParser, options: argparse.Namespace, flags: tuple[str, ...]) -> None:
    """Refuse a seed given twice to one of `flags` (a repeated unit is the same model counted again)."""
    for flag in flags:
        values = getattr(options, flag, None) or []
        if len(set(values)) < len(values):
            parser.error(f"--{flag} {' '.join(map(str, values))}: give each seed once (a repeated seed is the same "
                         "model again)")
