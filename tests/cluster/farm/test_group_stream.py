"""Asynchronous RL's farm side (``RolloutFarm.stream_groups``): groups keep running while the caller trains,
generation stays within its bound, each turn keeps the version it was sampled under across a weight change, and a
member older than ``max_staleness`` is masked or run again, never trained on as the newer version."""

from __future__ import annotations

import itertools
import time

import pytest

from cluster import RolloutFarm

HERE = {"app": "scripted", "in_process": True}  # a scripted policy played on the farm's own event loop

SHELL = {"agent": {"type": "mini_swe", "max_steps": 6},
         "environment": {"type": "shell", "command_timeout": 20, "setup_from_task": True},
         "runtime": {"type": "local"}, "verifier": {"type": "check_command"}, "run": {"concurrency": 8}}
TOKENS = {"type": "openai", "model": "scripted", "return_token_ids": True, "logprobs": True}


def farm(latency: float) -> RolloutFarm:
    return RolloutFarm.from_config({"model": TOKENS, "serve": {**HERE, "policy": "seed_writer", "latency": latency},
                                    "farm": {"backend": "local"}, **SHELL})


def endless(pause: float = 0.0):
    for k in itertools.count():
        yield {"task_id": f"t{k}", "prompt": "seed", "check": "true", "pause": pause}


def test_groups_keep_running_while_the_caller_trains_within_the_bound():
    with farm(latency=0.1) as f:
        f.set_policy_version(0)
        seen = []
        with f.stream_groups(endless(pause=0.3), n=2, batch_groups=2, max_staleness=1) as stream:
            assert stream.started == 4  # (0 updates + 1 + 1) x 2, at once, before the first batch is asked for
            for step in range(3):
                batch = stream.next_batch(timeout=120)
                seen.append((stream.started, stream.taken))
                assert len(batch.groups) == 2 and batch.failed == 0 and batch.stale == 0, batch.describe()
                assert batch.rewards == [[1.0, 1.0]] * 2
                assert set(batch.versions()) <= {str(step - 1), str(step)}, batch.versions()
                time.sleep(0.5)  # "training"
                f.set_policy_version(step + 1)  # the new version lets the next groups start, under it
                assert stream.started == (step + 1 + 2) * 2
        assert seen == [(4, 2), (6, 4), (8, 6)]  # never more started than the bound; refilled at each update
        assert stream.updates == 3 and stream.idle_seconds > 0.1  # all admitted groups done, held back by the bound
        after = f.generate([{"task_id": "after", "prompt": "seed", "check": "true"}], n=1)  # closing left it usable
        assert after.failed == 0


def test_more_batches_than_the_bound_allows_without_a_new_version_is_a_clear_error():
    with farm(latency=0.1) as f:
        f.set_policy_version(0)
        with f.stream_groups(endless(), n=1, batch_groups=2, max_staleness=0) as stream:
            stream.next_batch(timeout=120)
            with pytest.raises(RuntimeError, match="until a new policy version"):
                stream.next_batch(timeout=120)
            f.set_policy_version(1)  # the next batch may start now
            assert len(stream.next_batch(timeout=120).groups) == 2


def test_without_a_staleness_bound_the_farm_keeps_two_batches_beyond_what_was_taken():
    with farm(latency=0.1) as f:
        with f.stream_groups(endless(), n=1, batch_groups=3, max_staleness=None) as stream:
            assert stream.started == 6
            stream.next_batch(timeout=120)
            assert stream.started == 9 and stream.taken == 3


@pytest.mark.parametrize("max_staleness,on_stale", [(1, "mask"), (0, "mask"), (0, "rerun")])
def test_a_rollout_spanning_a_version_change_keeps_each_turns_version(max_staleness, on_stale):
    rows = [{"task_id": "slow", "prompt": "seed", "check": "true", "pause": 1.5}]  # turn 2 comes 1.5 s after turn 1
    with farm(latency=0.1) as f:
        f.set_policy_version(1)
        with f.stream_groups(rows, n=1, batch_groups=1, max_staleness=max_staleness, on_stale=on_stale) as stream:
            time.sleep(0.8)  # turn 1 was sampled under version 1; its command is sleeping
            f.set_policy_version(2)  # the weights change under the running rollout
            batch = stream.next_batch(timeout=120)
            with pytest.raises(StopIteration):
                next(stream)
    (member,), = [g.results for g in batch.groups]
    versions = [s.policy_version for s in member.trajectory.steps]
    if max_staleness == 1:  # one version behind is allowed: trained on, each token under its own version
        assert versions == ["1", "2"] and batch.masks == [[True]] and batch.stale == 0
        assert set(batch.versions()) == {"1", "2"} and all(batch.versions().values())
        (sample,) = batch.samples()
        assert set(sample.policy_versions) == {"1", "2"}
    elif on_stale == "mask":  # version 1's tokens never train as version 2's: the member is masked
        assert versions == ["1", "2"] and batch.stale == 1 and batch.masks == [[False]]
        assert batch.samples() == [] and batch.versions() == {}
    else:  # run again under version 2 alone
        assert versions == ["2", "2"] and batch.rerun == 1 and batch.stale == 0 and batch.masks == [[True]]
        assert list(batch.versions()) == ["2"]


def test_a_malformed_row_is_named_at_the_next_batch():
    from rollout.errors import ConfigError

    rows = [{"task_id": "ok", "prompt": "seed", "check": "true"}, {"prompt": "no id"}]
    with farm(latency=0.1) as f:
        with f.stream_groups(rows, n=1, batch_groups=1, max_staleness=None) as stream:
            with pytest.raises(ConfigError, match=r"tasks\[1\]: no task id"):
                stream.next_batch(timeout=120)


def test_bad_arguments_fail_before_any_work():
    with farm(latency=0.1) as f:
        for kwargs, field in [({"batch_groups": 0}, "batch_groups"),
                              ({"batch_groups": 1, "max_staleness": -1}, "max_staleness"),
                              ({"batch_groups": 1, "on_stale": "drop"}, "on_stale"),
                              ({"batch_groups": 1, "sampling": {"temprature": 1}}, "temprature")]:
            with pytest.raises(ValueError, match=field):
                f.stream_groups(endless(), n=2, **kwargs)


@pytest.mark.ray
def test_on_ray_workers_a_turn_keeps_its_version_and_the_bound_holds(ray_cluster):
    config = {"run_id": "group-stream", "model": {"type": "scripted", "policy": "seed_writer"},
              "farm": {"backend": "ray"}, **SHELL}
    rows = [{"task_id": "slow", "prompt": "seed", "check": "true", "pause": 1.5},
            *({"task_id": f"t{k}", "prompt": "seed", "check": "true"} for k in range(3))]
    with RolloutFarm.from_config(config) as f:
        f.set_policy_version(1)
        with f.stream_groups(rows, n=1, batch_groups=2, max_staleness=0) as stream:
            assert stream.started == 2  # max_staleness 0: one batch at a time, as a synchronous loop
            time.sleep(1.0)  # the slow row's turn 1 is done (version 1), its command sleeps
            f.set_policy_version(2)
            assert stream.started == 4  # the update admits the next batch, under version 2
            first = stream.next_batch(timeout=120)
            second = stream.next_batch(timeout=120)
    by_task = {g.task_id: g.results[0] for b in (first, second) for g in b.groups}
    assert [s.policy_version for s in by_task["slow"].trajectory.steps] == ["1", "2"]
    assert by_task["slow"].metadata.get("stale") is True  # one version behind, with a bound of 0: not trained on
    assert [s.policy_version for s in by_task["t2"].trajectory.steps] == ["2", "2"]
    assert first.stale + second.stale == 2  # "slow" and "t0", sampled under version 1, trained under 2


def test_an_event_loop_reads_the_stream_with_async_for():
    import asyncio

    rows = [{"task_id": f"r{k}", "prompt": "seed", "check": "true"} for k in range(3)]

    async def consume(stream) -> list[int]:
        return [len(batch.groups) async for batch in stream]

    with farm(latency=0.1) as f:
        with f.stream_groups(rows, n=1, batch_groups=2, max_staleness=None) as stream:
            assert asyncio.run(consume(stream)) == [2, 1]  # the last batch is short: the rows ran out
