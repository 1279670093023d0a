"""The driver: streams planned rollouts through a bounded window, retries infrastructure failures,
appends every finished attempt to the run store, and reports progress.

Where a rollout executes is the backend's business (``Backend.execute``); the local backend runs
it in this process. Task outcomes are final; infrastructure failures run again until the
(task, sample)'s attempt limit, each attempt on its own results line; a failure whose error says
``retryable: false`` is final at once.

While it runs, the driver keeps ``<run_dir>/live.json`` (``rollout.store.live``) up to date with the rollouts in
flight, and shows its progress: one line redrawn in place on a terminal, plain periodic lines elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol, TextIO

from cluster.backends.live_tracker import LiveTracker
from cluster.backends.seam import Backend
from rollout import events
from rollout.records import RequestMeta, RolloutResult, Task
from rollout.store import live
from rollout.store.resume import Plan, attempt_record, can_retry
from rollout.store.run_dir import partial_trajectory_writer
from rollout.store.summary import Progress, ProgressDisplay
from rollout.waits import cancel_and_wait, sleep_unless, within

log = logging.getLogger(__name__)

BACKEND_LIVE_TIMEOUT = 5.0
"""Seconds to wait for a backend's ``live()`` rows before writing the live view from what the driver knows."""
RETRY_BACKOFF = 1.0
"""Seconds before an infrastructure failure's next attempt, doubled for each further one up to ``RETRY_BACKOFF_MAX``
(with jitter): an engine or a node that failed many rollouts at once is not met by all of them again at once."""
RETRY_BACKOFF_MAX = 30.0
STOP_GRACE = 60.0
"""Seconds the cancelled rollouts (a runtime closing its containers) and the ticker may take to end when the run
stops; the driver then goes on without them, so the summary is written and the run's lock released."""


class ResultStore(Protocol):
    """Where the driver appends each finished attempt: a run directory (``RunStore``), or a trainer call's memory."""

    run_dir: Path | None
    """The run directory live.json goes to; None for a store without one."""

    def append(self, result: RolloutResult, trajectory: bool = True) -> RolloutResult: ...


def retry_backoff(retried: int) -> float:
    """Seconds before the next attempt, after ``retried`` earlier retries in this run (0: the first retry)."""
    return min(RETRY_BACKOFF_MAX, RETRY_BACKOFF * 2 ** max(0, retried)) * random.uniform(0.5, 1.0)


def rollout_meta(run_id: str, task: Task, sample: int, attempt: int, base_seed: int) -> RequestMeta:
    return RequestMeta(
        rollout_id=f"{task.task_id}#{sample}",
        task_id=task.task_id,
        sample_index=sample,
        attempt=attempt,
        run_id=run_id,
        seed=base_seed + sample,
        group_id=task.task_id,
    )


class Driver:
    def __init__(
        self,
        backend: Backend,
        store: ResultStore,
        plan: Plan,
        *,
        run_id: str,
        concurrency: int,
        base_seed: int = 0,
        progress_interval: float | None = 5.0,
        write_trajectories: bool = True,
        out: TextIO = sys.stderr,
        on_result: Callable[[RolloutResult], Awaitable[None] | None] | None = None,
        stop_when: Callable[[], bool] | None = None,
        live_dir: str | Path | None = None,
        tty: bool | None = None,
        keep_results: bool = True,
    ):
        self.backend, self.store, self.plan = backend, store, plan
        self.run_id, self.concurrency, self.base_seed = run_id, concurrency, base_seed
        self.progress_interval = progress_interval
        self.write_trajectories = write_trajectories
        self.out = out
        self.on_result = on_result
        self.stop_when = stop_when
        """Checked before each new (task, sample) starts: True leaves the rest unstarted (a token budget)."""
        self.not_started: list[tuple[Task, int, int]] = []
        self.keep_results = keep_results
        """False: ``finished`` stays empty (a batch job's results are on disk; holding each with its trajectory
        grew the driver by ~40 KB a rollout); ``ran`` and ``first_call`` are kept either way."""
        self.ran = 0
        """Final results so far (after retries)."""
        self.first_call: float | None = None
        """The earliest first model call of the results so far (wall clock), or None."""
        total = plan.done_count + plan.final_failed_count + len(plan.todo)
        self.progress = Progress(total, already_done=plan.done_count + plan.final_failed_count)
        self.finished: list[RolloutResult] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.tracker = LiveTracker()
        """The attempts in flight, updated by their events (the rows of backends without their own ``live()``)."""
        self.live_dir = Path(live_dir) if live_dir is not None else store.run_dir
        """Where live.json goes: the run directory (none for a store without one)."""
        self.live_interval = min(live.WRITE_INTERVAL, progress_interval or live.WRITE_INTERVAL)
        self.display = ProgressDisplay(out, tty=tty)
        """Progress on ``out``: redrawn in place when it is a terminal (or ``tty=True``), else plain lines."""
        self.started_at = time.time()
        self.state = live.RUNNING

    async def live_state(self) -> dict[str, Any]:
        """What live.json holds: progress, outcome counts, failures by type, and the in-flight rollouts (from the
        backend's ``live()`` when it has one, e.g. Ray workers; else from the rollouts' events)."""
        rows = None
        if self.state == live.RUNNING:
            try:
                rows = await within(self.backend.live(), BACKEND_LIVE_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - a view of the run must never stop it
                log.warning("the backend's live rows are unavailable: %s: %s", type(exc).__name__, exc)
                rows = None
        if rows is None:
            rows = self.tracker.rows() if self.state == live.RUNNING else []
        return live.live_document(self.run_id, self.progress.snapshot(), list(rows), in_flight=self.in_flight,
                                  state=self.state, started_at=self.started_at, interval=self.live_interval,
                                  limits=self.backend.node_limits(live.LIMIT_CHANGES))

    def status_line(self) -> str:
        """The progress line; in a log it names the run, on a terminal the width goes to the numbers."""
        running = self.backend.running()  # None: every rollout in flight runs; else the rest waits on its worker
        line = self.progress.status(min(self.in_flight, running) if running is not None else self.in_flight)
        return line if self.display.tty else f"[{self.run_id}] {line}"

    async def run(self) -> list[RolloutResult]:
        """Run every planned rollout; return the final result of each (after retries; none with
        ``keep_results=False``)."""
        queue: asyncio.Queue = asyncio.Queue()
        for item in self.plan.todo:
            queue.put_nowait(item)
        self._queue = queue
        # A backend that takes rollouts ahead of its free slots (Ray workers start them as slots free) gets them,
        # unless the run may stop starting new ones (a token budget): what was sent ahead would run anyway.
        ahead = self.backend.ahead if self.stop_when is None else 0
        window = self.concurrency + ahead
        workers = [asyncio.create_task(self._worker(queue)) for _ in range(min(window, len(self.plan.todo)))]
        self.started_at, self.state = time.time(), live.RUNNING
        stop = asyncio.Event()
        ticking = self.progress_interval or self.live_dir is not None
        ticker = asyncio.create_task(self._tick(stop)) if ticking else None
        try:
            if self.live_dir is not None:
                self._write_live(await self.live_state())
            await asyncio.gather(*workers)
            self.state = live.FINISHED
        except BaseException as exc:
            stopped = isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt))
            self.state = live.INTERRUPTED if stopped else live.FAILED
            raise
        finally:
            # The flag, not only the cancel, ends the ticker: a cancel can be lost (``rollout.waits``), and the
            # run hung here after its last rollout, holding its lock.
            stop.set()
            await cancel_and_wait([*workers, *([ticker] if ticker else [])], STOP_GRACE, "driver task")
            while not queue.empty():
                self.not_started.append(queue.get_nowait())
            if self.display.tty and self.progress_interval:
                self.display.show(self.status_line())
            self.display.end()
            self._write_live(live.live_document(
                self.run_id, self.progress.snapshot(), [], in_flight=0, state=self.state,
                started_at=self.started_at, interval=self.live_interval,
                limits=self.backend.node_limits(live.LIMIT_CHANGES)))
        return self.finished

    async def _worker(self, queue: asyncio.Queue) -> None:
        while True:
            if self.stop_when is not None and self.stop_when():
                return
            try:
                task, sample, attempt = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            result = await self._until_final(task, sample, attempt)
            self.ran += 1
            if result.trajectory.steps and (started := result.trajectory.steps[0].started_at):
                self.first_call = started if self.first_call is None else min(self.first_call, started)
            if self.keep_results:
                self.finished.append(result)
            self.progress.update(result)
            if self.on_result is not None:
                maybe = self.on_result(result)
                if asyncio.iscoroutine(maybe):
                    await maybe

    async def _until_final(self, task: Task, sample: int, attempt: int) -> RolloutResult:
        limit = self.plan.attempt_limit(task.task_id, sample)
        history = list(self.plan.attempt_history(task.task_id, sample))
        retried, waited = 0, 0.0
        while True:
            meta = rollout_meta(self.run_id, task, sample, attempt, self.base_seed)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            key = self.tracker.start(meta)
            t0 = time.perf_counter()
            try:
                result = await self.backend.execute(task, meta, [*self._observers(meta), self.tracker.observer(key)])
            finally:
                self.in_flight -= 1
                self.tracker.finish(key)
            result.timings.setdefault("wall", time.perf_counter() - t0)
            if waited:
                result.timings["backoff"] = waited  # before this attempt began
            history.append(attempt_record(result))
            result.attempts = list(history)
            self.store.append(result, trajectory=self.write_trajectories)
            if not can_retry(result) or attempt >= limit:
                return result
            waited = retry_backoff(retried)
            await asyncio.sleep(waited)
            attempt, retried = attempt + 1, retried + 1

    @property
    def reached(self) -> int:
        """The most rollouts that ran at once: the backend's count where some of those sent wait on a worker."""
        peak = self.backend.peak_running()
        return min(self.peak_in_flight, peak) if peak is not None else self.peak_in_flight

    def _observers(self, meta: RequestMeta) -> list[events.Observer]:
        if not self.write_trajectories:
            return []
        return [partial_trajectory_writer(self.store, meta)]

    async def _tick(self, stop: asyncio.Event) -> None:
        """Every ``live_interval`` until ``stop`` is set: rewrite live.json and redraw a terminal's status line;
        plain status lines (job logs) only every ``progress_interval``."""
        last_line = time.monotonic()
        while not await sleep_unless(stop, self.live_interval):
            self.backend.note_queue(self._queue.qsize())  # queue depth: not yet started + waiting for a slot
            if self.live_dir is not None:
                try:
                    self._write_live(await self.live_state())
                except Exception:  # noqa: BLE001 - a broken view must not stop the progress lines
                    log.exception("cannot update the live view")
            if not self.progress_interval:
                continue
            now = time.monotonic()
            if self.display.tty or now - last_line >= self.progress_interval - 1e-3:
                last_line = now
                self.display.show(self.status_line())

    def _write_live(self, doc: dict[str, Any]) -> None:
        if self.live_dir is None:
            return
        try:
            live.write_live(self.live_dir, doc)
        except OSError as exc:  # a full or vanished disk shows up in the results; the view is best effort
            log.warning("cannot write %s: %s", live.live_path(self.live_dir), exc)

