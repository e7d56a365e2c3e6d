"""What every entry point's command line shares: reading a fine-tuning script's flags (`parse_fine_tuning_args`), and
`run_cli`, the `cli()` of `python <script>.py`, which ends bad input with one line and a stop with its own status."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager


class RunInterrupted(Exception):
    """Ctrl-C (exit status 130) or SIGTERM (143) stopped a fine-tuning script; the message says what was saved and
    how to continue."""

    exit_code = 130

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM (a preempted cluster job, `kill`), raised wherever the script was, as Ctrl-C raises KeyboardInterrupt:
    the script's own handling of a Ctrl-C (what was saved, how to go on) then covers it (`stop_on_sigterm`)."""


@contextmanager
def stop_on_sigterm():
    """Within this block SIGTERM stops the process as Ctrl-C does, as `Terminated` (Python's default ends it with no
    message); the earlier handler is restored after it."""
    def terminate(signum, frame):
        raise Terminated

    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        yield
        return
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped_by(stop: KeyboardInterrupt) -> tuple[str, int]:
    """What stopped a run, in words, and the exit status it ends with: ("Ctrl-C", 130) or ("SIGTERM", 143)."""
    return ("SIGTERM", 128 + signal.SIGTERM) if isinstance(stop, Terminated) else ("Ctrl-C", 130)


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
EVERY_RANK = {"every_rank": True}  # `extra=` of a log record about one process: every process writes its own


def process_rank() -> int:
    """This process's global rank as the launcher set it (torchrun, accelerate, Slurm via our launchers); 0 alone."""
    return int(os.environ.get("RANK", "0"))


class MainProcessOnly(logging.Filter):
    """Passes every record on the main process (rank 0); elsewhere only errors and records about that process
    (logged with `extra=EVERY_RANK`), so a DDP run's log and its stop message read once, not once per process."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        return self.rank == 0 or record.levelno >= logging.ERROR or getattr(record, "every_rank", False)


def configure_logging(level: int = logging.INFO) -> None:
    """The entry points' logging: one line format, and under several processes the main process's lines only
    (`MainProcessOnly` on the root handlers, which every logger's records pass through)."""
    logging.basicConfig(format=LOG_FORMAT, level=level)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, MainProcessOnly) for f in handler.filters):
            handler.addFilter(MainProcessOnly(process_rank()))


def run_cli(main: Callable[[], object], script: str, *, stops: tuple[type[BaseException], ...] = (),
            interrupted: str | None = None, traceback_env: str | None = None) -> None:
    """Run `main()` (which reads `sys.argv`) as `python <script>` does, ending in one line on stderr, not a traceback:
    - a stop in `stops` (TrainingDiverged, TrainingStopped, RunInterrupted: each carries its `exit_code`):
      `<script>: <message>` (by the main process alone under several), exit status `exit_code`;
    - ValueError or OSError (bad input: a flag, a file, a folder): `<script>: error: <message>`, exit status 2, or
      the traceback when the environment variable `traceback_env` is set;
    - a Ctrl-C that `main` did not turn into a stop of its own (while Python was still importing, say):
      `<script>: <interrupted>`, exit status 130; Python's own handling when `interrupted` is None."""
    try:
        main()
    except stops as stop:
        # Every process stops at the same step: the main one says so, once.
        tell(f"{script}: {stop}", echo=process_rank() == 0)
        raise SystemExit(stop.exit_code) from None
    except (ValueError, OSError) as error:
        if traceback_env and os.environ.get(traceback_env):
            raise
        tell(f"{script}: error: {error}")
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        print(f"{script}: {interrupted}", file=sys.stderr)
        raise SystemExit(130) from None


def tell(line: str, echo: bool = True) -> None:
    """Print the line that ends a run on stderr (`echo`) and, under torchrun (`accelerate launch`), also leave it in
    the process's error file: torchrun's failure summary then shows it as the process's "traceback" (the root cause),
    not "To enable traceback see ..."."""
    import json
    import time

    if echo:
        print(line, file=sys.stderr)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        try:
            with open(error_file, "w", encoding="utf-8") as handle:
                json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                      "timestamp": str(int(time.time()))}}}, handle)
        except OSError:  # the summary then says what it says without it
            pass


def parse_fine_tuning_args(arguments: type, defaults: list[str], argv: list[str] | None, description: str | None):
    """The script's `arguments` dataclass and TrainingArguments from `argv` (default: the command line), on top of
    the script's `defaults` (the user's flags win), with pinned memory only where an accelerator can use it."""
    import argparse

    from transformers import HfArgumentParser, TrainingArguments

    from encoder_zoo.training.run.loading import pin_memory_only_with_an_accelerator

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser((arguments, TrainingArguments), description=description,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    args, training_args = parser.parse_args_into_dataclasses(args=defaults + argv)
    pin_memory_only_with_an_accelerator(training_args)
    return args, training_args
