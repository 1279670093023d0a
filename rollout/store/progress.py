"""Live progress of a run: one status line (done/total, rate, ETA, outcomes, infrastructure failures by type),
redrawn in place on a terminal, plain lines elsewhere."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from typing import Any, Callable, Iterable, TextIO

from rollout.records import RolloutResult


class Progress:
    """One-line status of a run, fed finished results: ``12/40 done  3.2/s  ETA 9s  submitted=10  infra=0``.

    ``already_done`` counts results a resumed run skipped: shown as done, left out of the rate.
    ``status`` adds the rollouts in flight and the infrastructure failures by error type; ``snapshot``
    gives the same numbers as a dict (the live view stores it, ``format_progress`` renders it).
    """

    def __init__(self, total: int, already_done: int = 0, clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.already_done = already_done
        self.finished = 0
        self.outcomes: Counter[str] = Counter()
        self.infra = 0
        self.failures: Counter[str] = Counter()
        """Final infrastructure failures by error type."""
        self._clock = clock
        self._start = clock()

    def update(self, result: RolloutResult) -> str:
        """Count one finished rollout and return the new status line."""
        self.finished += 1
        if result.status == "completed":
            self.outcomes[result.exit_reason.value] += 1
        else:
            self.infra += 1
            self.failures[result.error.type if result.error else result.exit_reason.value] += 1
        return self.line()

    def snapshot(self) -> dict[str, Any]:
        """The numbers behind the status line: done/total, ``ran`` in this session (the rate's base, per second),
        ETA, outcome counts, and final infrastructure failures by error type."""
        elapsed = max(self._clock() - self._start, 1e-9)
        rate = self.finished / elapsed
        remaining = max(self.total - self.already_done - self.finished, 0)
        return {
            "done": self.already_done + self.finished,
            "total": self.total,
            "ran": self.finished,
            "elapsed": elapsed,
            "rate": rate,
            "eta_seconds": remaining / rate if rate > 0 else None,
            "outcomes": dict(sorted(self.outcomes.items())),
            "infra_failed": self.infra,
            "failures_by_type": count_by(self.failures.elements()),
        }

    def line(self) -> str:
        return format_progress(self.snapshot(), failure_types=False)

    def status(self, in_flight: int | None = None) -> str:
        """``line`` plus the rollouts in flight and failures by type: ``... in_flight=3 ... infra=1 (ModelError=1)``."""
        return format_progress(self.snapshot(), in_flight)


def format_progress(snapshot: dict[str, Any], in_flight: int | None = None, failure_types: bool = True) -> str:
    """``Progress.snapshot()`` (or a live.json) as one line: done/total, rate, ETA, in flight, outcomes, failures."""
    rate = snapshot.get("rate") or 0.0
    eta = snapshot.get("eta_seconds")
    speed = f"{rate * 60:.1f}/min" if 0 < rate < 0.1 else f"{rate:.1f}/s"  # SWE rollouts take minutes
    parts = [f"{snapshot['done']}/{snapshot['total']} done", speed, f"ETA {'?' if eta is None else _duration(eta)}"]
    if in_flight is not None:
        parts.append(f"in_flight={in_flight}")
    parts.extend(f"{k}={v}" for k, v in sorted((snapshot.get("outcomes") or {}).items()))
    infra = f"infra={snapshot.get('infra_failed', 0)}"
    types = snapshot.get("failures_by_type") or {}
    if failure_types and types:
        infra += " (" + ", ".join(f"{k}={v}" for k, v in types.items()) + ")"
    return "  ".join([*parts, infra])


class ProgressDisplay:
    """Where status lines go. On a terminal: one line redrawn in place (carriage return, clipped to the
    terminal's width). Elsewhere (job logs, files): plain lines, one per ``show``."""

    def __init__(self, stream: TextIO, tty: bool | None = None, width: int | None = None):
        self.stream = stream
        self.tty = _isatty(stream) if tty is None else tty
        self.width = width
        self._drawn = False

    def show(self, text: str) -> None:
        if self.tty:
            width = self.width or shutil.get_terminal_size().columns
            self.stream.write("\r" + text[: max(width - 1, 20)] + "\x1b[K")  # clear what a longer line left
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def end(self) -> None:
        """Leave the redrawn line in place and move to a fresh line for whatever is printed next."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return False


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"


def count_by(values: Iterable[str]) -> dict[str, int]:
    """Counts, most frequent first (ties by name)."""
    return dict(sorted(Counter(values).items(), key=lambda kv: (-kv[1], kv[0])))
