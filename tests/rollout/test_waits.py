"""Waits a cancel cannot slip past (``rollout.waits``): a cancel landing in the turn the awaited call finishes still
cancels, a background loop ends by its flag even when its cancel was lost, the wait for cancelled tasks is bounded,
and no code of ours wraps a call in ``asyncio.wait_for`` (Python 3.11 loses such cancels, CPython gh-86296)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from rollout.waits import cancel_and_wait, sleep_unless, within

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 has only wait_for, whose race remains")
def test_a_cancel_in_the_turn_the_call_finishes_is_not_lost():
    async def scenario() -> None:
        answer = asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(within(answer, 60))
        await asyncio.sleep(0)  # it waits for the answer
        answer.set_result("rows")
        waiting.cancel()  # in the same turn: wait_for would return "rows" here and the cancel would be gone
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(scenario())


def test_within_bounds_a_call_and_passes_its_answer():
    async def scenario() -> tuple[str, bool]:
        answer = await within(asyncio.sleep(0, "rows"), 60)
        try:
            await within(asyncio.Event().wait(), 0.01)
        except asyncio.TimeoutError:
            return answer, True
        return answer, False

    assert asyncio.run(scenario()) == ("rows", True)


def test_a_loop_whose_cancel_is_lost_still_ends_by_its_flag():
    rounds = []

    async def ticker(stop: asyncio.Event) -> None:
        while not await sleep_unless(stop, 3600):  # an hour: only the flag can end this wait
            rounds.append(1)

    async def stubborn(stop: asyncio.Event) -> None:  # as a loop whose cancel was swallowed goes on
        while True:
            try:
                await ticker(stop)
                return
            except asyncio.CancelledError:
                continue

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(stubborn(stop))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0)
        stop.set()
        await within(task, 30)  # ends instead of sleeping for an hour

    asyncio.run(scenario())
    assert rounds == []


def test_tasks_that_outlive_their_cancel_are_left_behind_after_the_bound():
    async def ignores_cancel(release: asyncio.Event) -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    async def ends(release: asyncio.Event) -> None:
        await release.wait()

    async def scenario() -> tuple[set, bool]:
        release = asyncio.Event()
        stuck, normal = asyncio.create_task(ignores_cancel(release)), asyncio.create_task(ends(release))
        await asyncio.sleep(0)  # both wait
        left = await within(cancel_and_wait([stuck, normal], 0.05, "probe"), 30)  # returns instead of hanging
        release.set()
        await stuck
        return left == {stuck}, normal.cancelled()

    assert asyncio.run(scenario()) == (True, True)


def test_no_code_of_ours_waits_with_asyncio_wait_for():
    users = [f"{path.relative_to(ROOT)}:{number}"
             for package in ("rollout", "cluster", "agents", "envs")
             for path in sorted((ROOT / package).rglob("*.py")) if path.name != "waits.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if "wait_for(" in line]
    assert users == [], "use rollout.waits.within: wait_for loses a cancel that lands as its call finishes"
