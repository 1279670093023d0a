"""The worker's batch protocol without Ray (the channel's other end): many rollouts per ``submit``, every
finished one from one ``collect``, ``cancel`` reported as None, and results that survive the JSON trip."""

from __future__ import annotations

import asyncio
import math

from cluster.backends.sources import ConfigSource
from cluster.compose import Composer
from cluster.config.run_config import RunConfig
from cluster.workers.wire import JSON, PICKLE, decode_result, encode_result
from cluster.workers.worker import RolloutWorker
from rollout.config.load import validate
from rollout.records import ExitReason, RequestMeta, RolloutResult, Task


def worker(delay: float = 0.0) -> RolloutWorker:
    raw = {
        "run_id": "mailbox",
        "model": {"type": "scripted", "policy": "bash_echo"},
        "agent": {"type": "mini_swe", "max_steps": 5},
        "environment": {"type": "shell"},
        "runtime": {"type": "null", "echo": True, "delay": delay},
        "dataset": {"path": "-"},
    }
    return RolloutWorker(ConfigSource(Composer(validate(RunConfig, raw))))


def item(seq: int, task_id: str) -> tuple[int, Task, RequestMeta]:
    return seq, Task(task_id=task_id, prompt="go"), RequestMeta(rollout_id=f"{task_id}#0", task_id=task_id,
                                                               run_id="mailbox")


def test_one_submit_runs_many_and_collect_returns_each_result_once():
    async def main():
        w = worker()
        assert await w.submit([item(i, f"t{i}") for i in range(20)]) == 20
        got: dict[int, RolloutResult] = {}
        while len(got) < 20:
            for seq, payload in await w.collect(5.0):
                assert seq not in got
                got[seq] = decode_result(payload)
        assert await w.collect(0.05) == [], "nothing is delivered twice"
        await w.shutdown()
        return got

    got = asyncio.run(main())
    assert sorted(got) == list(range(20))
    assert {r.task_id for r in got.values()} == {f"t{i}" for i in range(20)}
    assert all(r.exit_reason == ExitReason.SUBMITTED and len(r.trajectory.steps) == 3 for r in got.values())


def test_a_cancelled_rollout_reports_none_and_the_others_finish():
    async def main():
        w = worker(delay=0.3)
        await w.submit([item(0, "slow"), item(1, "other")])
        await asyncio.sleep(0.1)
        await w.cancel([0, 99])  # an unknown seq is ignored
        out = {}
        while len(out) < 2:
            out.update(dict(await w.collect(5.0)))
        await w.shutdown()
        return out

    out = asyncio.run(main())
    assert out[0] is None
    assert decode_result(out[1]).exit_reason == ExitReason.SUBMITTED


def test_results_keep_non_finite_numbers_and_fall_back_to_pickle_for_objects():
    result = RolloutResult(rollout_id="a#0", task_id="a", status="completed", exit_reason=ExitReason.SUBMITTED,
                           reward=float("nan"), timings={"total": float("inf")})
    kind, data = encode_result(result)
    back = decode_result((kind, data))
    assert kind == JSON and math.isnan(back.reward) and back.timings["total"] == math.inf

    odd = result.model_copy(update={"metadata": {"handle": object}})  # a class: JSON cannot carry it
    kind, data = encode_result(odd)
    assert kind == PICKLE and decode_result((kind, data)).metadata["handle"] is object


def test_past_its_slots_a_worker_holds_rollouts_and_starts_each_as_a_slot_frees():
    async def main():
        w = worker(delay=0.05)
        await w.submit([item(i, f"t{i}") for i in range(6)], slots=2)
        most = 0
        got: dict[int, RolloutResult] = {}
        while len(got) < 6:
            most = max(most, len(w.live()))
            assert len(w.live()) + w.waiting + len(got) <= 6
            for seq, payload in await w.collect(0.01):
                got[seq] = decode_result(payload)
        await w.shutdown()
        return most, got

    most, got = asyncio.run(main())
    assert most == 2, "never more running than the slots it was given"
    assert all(r.exit_reason == ExitReason.SUBMITTED for r in got.values())
    # first come, first started: the last two waited for two rollouts each (3 commands of 50 ms)
    assert got[5].timings["queued"] > got[0].timings["queued"] + 0.2
    assert got[0].timings["queued"] < 0.1


def test_a_waiting_rollout_cancelled_never_starts():
    async def main():
        w = worker(delay=0.1)
        await w.submit([item(0, "running"), item(1, "waiting")], slots=1)
        await asyncio.sleep(0.05)
        await w.cancel([1])
        out = {}
        while len(out) < 2:
            out.update(dict(await w.collect(5.0)))
        info = w.info()
        await w.shutdown()
        return out, info

    out, info = asyncio.run(main())
    assert out[1] is None and info["waiting"] == 0
    assert decode_result(out[0]).exit_reason == ExitReason.SUBMITTED
    assert info["finished"] == 1, "the cancelled one never ran"
