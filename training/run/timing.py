"""Where a run's time goes: per logging interval, the share of wall time spent waiting for data, in forward and
backward, in the optimizer step and saving checkpoints (the rest: logging, evaluation, Python between steps).

No host sync per step: a step only records marks (`time.perf_counter()`, and CUDA events on a GPU, where the host runs
ahead of the device), read when the interval is logged, which syncs anyway. Waiting for data and saving are host
time; forward + backward and the optimizer step are device time between the marks on a GPU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

PHASES = ("data", "forward_backward", "optimizer", "checkpoint")
LABELS = {"data": "waiting for data", "forward_backward": "forward and backward", "optimizer": "optimizer step",
          "checkpoint": "saving checkpoints", "other": "other"}
RECORD = "time_shares.json"  # the run's totals so far, saved with each checkpoint and read back by a resume


class _Mark:
    """A point in time on the host and, with CUDA, on the device's stream."""

    def __init__(self, cuda: bool):
        self.host = time.perf_counter()
        self.event = None
        if cuda:
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()

    def until(self, later: _Mark) -> float:
        """Seconds from this mark to `later` (device time where both carry an event; `later` must have completed)."""
        if self.event is not None and later.event is not None:
            return self.event.elapsed_time(later.event) / 1000
        return later.host - self.host


class TimeShares:
    """The trainer's clock: `begin(phase)` / `end(phase)` around each phase, `interval()` at each log."""

    def __init__(self, cuda: bool | None = None):
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self._open: dict[str, _Mark] = {}
        self._spans: list[tuple[str, _Mark, _Mark]] = []
        self._interval_start = time.perf_counter()
        self.totals = {phase: 0.0 for phase in (*PHASES, "wall")}

    def begin(self, phase: str, device: bool = False) -> None:
        self._open[phase] = _Mark(self.cuda and device)

    def end(self, phase: str, device: bool = False) -> None:
        start = self._open.pop(phase, None)
        if start is not None:
            self._spans.append((phase, start, _Mark(self.cuda and device)))

    def restart(self) -> None:
        """Forget the marks so far (training starts now)."""
        self._open.clear()
        self._spans.clear()
        self._interval_start = time.perf_counter()

    def interval(self) -> dict[str, float]:
        """Seconds per phase since the last call, `other` and `wall` included; added to the run's totals."""
        if self.cuda and self._spans:
            last = self._spans[-1][2].event
            if last is not None:
                last.synchronize()
        seconds = {phase: 0.0 for phase in PHASES}
        for phase, start, end in self._spans:
            seconds[phase] += start.until(end)
        self._spans.clear()
        now = time.perf_counter()
        seconds["wall"] = now - self._interval_start
        self._interval_start = now
        for phase, value in seconds.items():
            self.totals[phase] += value
        seconds["other"] = max(seconds["wall"] - sum(seconds[phase] for phase in PHASES), 0.0)
        return seconds

    # ---------------------------------------------------------------- the run's totals, across resumes
    def save(self, checkpoint: Path) -> None:
        (Path(checkpoint) / RECORD).write_text(json.dumps({key: round(v, 3) for key, v in self.totals.items()}))

    def load(self, checkpoint: Path) -> None:
        path = Path(checkpoint) / RECORD
        if path.is_file():
            saved = json.loads(path.read_text())
            self.totals = {key: float(saved.get(key, 0.0)) for key in self.totals}


def shares_text(seconds: dict[str, float]) -> str:
    """'waiting for data 3%, forward and backward 81%, ... of 12.3 s'."""
    wall = seconds.get("wall") or 0.0
    if wall <= 0:
        return "no time measured"
    other = max(wall - sum(seconds.get(phase, 0.0) for phase in PHASES), 0.0)
    parts = [f"{LABELS[phase]} {100 * seconds.get(phase, 0.0) / wall:.0f}%" for phase in PHASES]
    return f"{', '.join(parts)}, {LABELS['other']} {100 * other / wall:.0f}% of {wall:,.1f} s"
