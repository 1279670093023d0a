"""The farm's metrics: ``ray.util.metrics`` instruments fed by the rollout loop's events.

Workers count what their rollouts do (an observer on every rollout); the Ray backend counts what the
scheduler sees (attempts, slots in use, rollouts waiting for a slot, workers lost, deadlines hit). Ray
exports them on each node's metrics port in Prometheus format with a ``ray_`` prefix (counters also get
``_total``), labelled with ``run`` plus Ray's own ``NodeAddress``/``WorkerId``/``SessionName``.

| name (as exported)                       | kind      | tags                     | what                              |
|------------------------------------------|-----------|--------------------------|-----------------------------------|
| ray_rollout_farm_rollouts_started_total  | counter   | run                      | attempts that started on a worker |
| ray_rollout_farm_rollouts_finished_total | counter   | run, status, exit_reason | attempts that finished            |
| ray_rollout_farm_rollouts_in_flight      | gauge     | run                      | attempts running (scheduler)      |
| ray_rollout_farm_queue_depth             | gauge     | run                      | rollouts not started yet (queued) |
| ray_rollout_farm_attempts_total          | counter   | run, status, exit_reason | attempts the scheduler saw end    |
| ray_rollout_farm_workers_lost_total      | counter   | run                      | worker actors that died           |
| ray_rollout_farm_step_seconds            | histogram | run                      | one turn: model call + actions    |
| ray_rollout_farm_model_seconds           | histogram | run                      | one model call                    |
| ray_rollout_farm_command_seconds         | histogram | run                      | one action / shell command        |
| ray_rollout_farm_container_start_seconds | histogram | run                      | reset (container start)           |
| ray_rollout_farm_grading_seconds         | histogram | run                      | the verifier (SWE grading)        |
| ray_rollout_farm_tokens_total            | counter   | run, kind                | prompt / completion tokens        |
| ray_rollout_farm_reward_total            | counter   | run                      | reward sum (mean: / finished)     |

Histograms export ``_bucket``, ``_sum`` and ``_count`` series. ``METRICS`` below is the source of this
table; ``configs/grafana/rollout_farm.json`` uses only these names (a test checks it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from rollout import events

SECONDS_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                   600.0, 1800.0]

PREFIX = "rollout_farm_"

METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "rollouts_started": ("counter", "Rollout attempts that started on a worker", ("run",)),
    "rollouts_finished": ("counter", "Rollout attempts that finished, by status and exit reason",
                          ("run", "status", "exit_reason")),
    "rollouts_in_flight": ("gauge", "Rollout attempts running now (scheduler's count)", ("run",)),
    "queue_depth": ("gauge", "Rollouts not started yet: not admitted by the driver's window, or waiting for a slot",
                    ("run",)),
    "attempts": ("counter", "Attempts as the scheduler saw them end, by status and exit reason",
                 ("run", "status", "exit_reason")),
    "workers_lost": ("counter", "Worker actors that died (their rollouts ran again)", ("run",)),
    "step_seconds": ("histogram", "Seconds per turn: model call plus actions", ("run",)),
    "model_seconds": ("histogram", "Seconds per model call", ("run",)),
    "command_seconds": ("histogram", "Seconds per action or shell command", ("run",)),
    "container_start_seconds": ("histogram", "Seconds per environment reset (container start, checkout)", ("run",)),
    "grading_seconds": ("histogram", "Seconds per verification (SWE grading in a fresh container)", ("run",)),
    "tokens": ("counter", "Tokens, by kind (prompt, completion)", ("run", "kind")),
    "reward": ("counter", "Sum of rewards of finished rollouts", ("run",)),
}


def exported_names() -> set[str]:
    """Every series name Prometheus sees for the farm's metrics."""
    names = set()
    for name, (kind, _, _) in METRICS.items():
        full = f"ray_{PREFIX}{name}"
        if kind == "counter":
            names.add(full + "_total")
        elif kind == "gauge":
            names.add(full)
        else:
            names.update({full + "_bucket", full + "_sum", full + "_count"})
    return names


FLUSH_INTERVAL = 1.0
"""Seconds between hand-overs of buffered records to Ray (which exports every few seconds anyway)."""


class FarmMetrics:
    """The instruments of one process (a worker or the driver), created on first use.

    Records are buffered in plain Python (counters summed, the last gauge value kept, histogram samples
    listed) and handed to Ray every ``FLUSH_INTERVAL`` seconds by a task on the running event loop, so a
    rollout's dozen or so records cost dictionary updates, not calls into Ray's recorder. Without a running
    loop a record goes straight through. ``aclose()`` hands over what is left."""

    def __init__(self, run_id: str, interval: float = FLUSH_INTERVAL):
        self.run = run_id
        self.interval = interval
        self._instruments: dict[str, Any] = {}
        self._counts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._samples: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
        self._flusher: asyncio.Task | None = None

    def _get(self, name: str) -> Any:
        inst = self._instruments.get(name)
        if inst is None:
            from ray.util import metrics

            kind, description, tags = METRICS[name]
            if kind == "counter":
                inst = metrics.Counter(PREFIX + name, description=description, tag_keys=tags)
            elif kind == "gauge":
                inst = metrics.Gauge(PREFIX + name, description=description, tag_keys=tags)
            else:
                inst = metrics.Histogram(PREFIX + name, description=description, boundaries=SECONDS_BUCKETS,
                                         tag_keys=tags)
            self._instruments[name] = inst
        return inst

    def inc(self, name: str, value: float = 1.0, **tags: str) -> None:
        if value:
            key = (name, tuple(tags.items()))
            self._counts[key] = self._counts.get(key, 0.0) + value
            self._schedule()

    def set(self, name: str, value: float, **tags: str) -> None:
        self._gauges[(name, tuple(tags.items()))] = value
        self._schedule()

    def observe(self, name: str, value: float, **tags: str) -> None:
        self._samples.setdefault((name, tuple(tags.items())), []).append(value)
        self._schedule()

    def _schedule(self) -> None:
        if self._flusher is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop here: write through
            self.flush()
            return
        self._flusher = loop.create_task(self._flush_every())

    async def _flush_every(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - metrics never stop rollouts; the next flush tries again
                pass

    def flush(self) -> None:
        """Hand every buffered record to Ray."""
        counts, self._counts = self._counts, {}
        gauges, self._gauges = self._gauges, {}
        samples, self._samples = self._samples, {}
        for (name, tags), value in counts.items():
            self._get(name).inc(value, tags={"run": self.run, **dict(tags)})
        for (name, tags), value in gauges.items():
            self._get(name).set(value, tags={"run": self.run, **dict(tags)})
        for (name, tags), values in samples.items():
            instrument, full = self._get(name), {"run": self.run, **dict(tags)}
            for value in values:
                instrument.observe(value, tags=full)

    async def aclose(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
            self._flusher = None
        self.flush()

    def observer(self, event: events.Event) -> None:
        """The rollout loop's events → instruments (cheap: called inline on every event)."""
        data = event.data
        kind = event.kind
        if kind == events.MODEL_CALL_DONE:
            self.observe("model_seconds", data.get("seconds", 0.0))
            self.inc("tokens", data.get("prompt_tokens") or 0, kind="prompt")
            self.inc("tokens", data.get("completion_tokens") or 0, kind="completion")
        elif kind == events.ACTION_EXECUTED:
            self.observe("command_seconds", data.get("seconds") or 0.0)
        elif kind == events.STEP_DONE:
            self.observe("step_seconds", (data.get("model_seconds") or 0.0) + (data.get("env_seconds") or 0.0))
        elif kind == events.ENV_READY:
            self.observe("container_start_seconds", data.get("seconds", 0.0))
        elif kind == events.VERIFY_DONE:
            self.observe("grading_seconds", data.get("seconds", 0.0))
        elif kind == events.ROLLOUT_STARTED:
            self.inc("rollouts_started")
        elif kind == events.ROLLOUT_FINISHED:
            self.inc("rollouts_finished", status=str(data.get("status")), exit_reason=str(data.get("exit_reason")))
            if data.get("reward"):
                self.inc("reward", float(data["reward"]))
