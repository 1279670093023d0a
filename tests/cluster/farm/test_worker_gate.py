"""The worker's gate around its model passes on what the model declares beyond ``complete``: each rollout's end
(a sticky replica freed, a token stream forgotten) and the connections closed at shutdown."""

from __future__ import annotations

import asyncio

from agents.swe_agent import MiniSweAgent
from cluster.backends.sources import ObjectSource
from cluster.workers.worker import RolloutWorker
from envs.runtimes.null import NullRuntime
from envs.shell_env import ShellEnvironment
from rollout.models.scripted import ScriptedModel
from rollout.records import ExitReason, RequestMeta, Task


class SessionModel(ScriptedModel):
    """The scripted model, keeping a session per rollout and a connection, as the HTTP client does."""

    def __init__(self):
        super().__init__(["```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"] * 3)
        self.ended: list[str] = []
        self.closed = 0

    async def end_session(self, meta: RequestMeta) -> None:
        self.ended.append(meta.rollout_id)

    async def aclose(self) -> None:
        self.closed += 1


def test_the_gated_model_ends_every_rollout_s_session_and_closes_the_model_at_shutdown():
    model = SessionModel()
    source = ObjectSource(model, MiniSweAgent(), lambda task, meta: ShellEnvironment(NullRuntime({"echo": True})))

    async def main():
        worker = RolloutWorker(source)
        results = [await worker.execute(Task(task_id=f"t{i}", prompt="go"),
                                        RequestMeta(rollout_id=f"t{i}#0", task_id=f"t{i}")) for i in range(3)]
        await worker.shutdown()
        return results

    results = asyncio.run(main())
    assert [r.exit_reason for r in results] == [ExitReason.SUBMITTED] * 3
    assert model.ended == ["t0#0", "t1#0", "t2#0"] and model.closed == 1


def test_a_model_without_sessions_or_connections_runs_behind_the_gate_all_the_same():
    source = ObjectSource(ScriptedModel(["```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"]), MiniSweAgent(),
                          lambda task, meta: ShellEnvironment(NullRuntime({"echo": True})))

    async def main():
        worker = RolloutWorker(source)
        result = await worker.execute(Task(task_id="t", prompt="go"), RequestMeta(rollout_id="t#0", task_id="t"))
        await worker.shutdown()
        return result

    assert asyncio.run(main()).exit_reason == ExitReason.SUBMITTED
