"""The driver: streams planned rollouts through a bounded window, retries infrastructure failures,
appends every finished attempt to the run store, and reports progress.

Where a rollout executes is the backend's business (``Backend.execute``); the local backend runs
it in this process. Task outcomes are final; infrastructure failures run again until the
(task, sample)'s attempt limit, each attempt on its own results line.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Awaitable, Callable, Protocol, TextIO

from rollout import events
from rollout.records import RequestMeta, RolloutResult, Task
from rollout.resume import Plan, attempt_record
from rollout.run_store import RunStore
from rollout.summary import Progress

TRAJECTORY_WRITE_INTERVAL = 2.0
"""Seconds between rewrites of a running rollout's trajectory file (plus one at the end)."""


class Backend(Protocol):
    async def execute(self, task: Task, meta: RequestMeta, observers: list[events.Observer]) -> RolloutResult: ...


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
        store: RunStore,
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
        total = plan.done_count + plan.final_failed_count + len(plan.todo)
        self.progress = Progress(total, already_done=plan.done_count + plan.final_failed_count)
        self.finished: list[RolloutResult] = []
        self.in_flight = 0

    async def run(self) -> list[RolloutResult]:
        """Run every planned rollout; return the final result of each (after retries)."""
        queue: asyncio.Queue = asyncio.Queue()
        for item in self.plan.todo:
            queue.put_nowait(item)
        workers = [asyncio.create_task(self._worker(queue)) for _ in range(min(self.concurrency, len(self.plan.todo)))]
        ticker = asyncio.create_task(self._tick()) if self.progress_interval else None
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
            if ticker is not None:
                ticker.cancel()
            await asyncio.gather(*workers, *([ticker] if ticker else []), return_exceptions=True)
            while not queue.empty():
                self.not_started.append(queue.get_nowait())
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
            self.finished.append(result)
            self.progress.update(result)
            if self.on_result is not None:
                maybe = self.on_result(result)
                if asyncio.iscoroutine(maybe):
                    await maybe

    async def _until_final(self, task: Task, sample: int, attempt: int) -> RolloutResult:
        limit = self.plan.attempt_limit(task.task_id, sample)
        history = list(self.plan.attempt_history(task.task_id, sample))
        while True:
            meta = rollout_meta(self.run_id, task, sample, attempt, self.base_seed)
            self.in_flight += 1
            t0 = time.perf_counter()
            try:
                result = await self.backend.execute(task, meta, self._observers(meta))
            finally:
                self.in_flight -= 1
            result.timings.setdefault("wall", time.perf_counter() - t0)
            history.append(attempt_record(result))
            result.attempts = list(history)
            self.store.append(result, trajectory=self.write_trajectories)
            if result.status == "completed" or attempt >= limit:
                return result
            attempt += 1

    def _observers(self, meta: RequestMeta) -> list[events.Observer]:
        if not self.write_trajectories:
            return []
        last = [0.0]

        def write_partial(event: events.Event) -> None:
            # Throttled: a killed run still shows how far each rollout got, without a write per step.
            trajectory = event.data.get("trajectory")
            now = time.monotonic()
            if event.kind == events.STEP_DONE and trajectory is not None and now - last[0] >= TRAJECTORY_WRITE_INTERVAL:
                last[0] = now
                self.store.write_trajectory(meta, trajectory)

        return [write_partial]

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.progress_interval)
            print(f"[{self.run_id}] {self.progress.line()}  in_flight={self.in_flight}", file=self.out, flush=True)

