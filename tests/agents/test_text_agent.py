"""The text-action agent: parsers chosen by config, step environments, and caller-driven stepping."""

import asyncio

import pytest

from agents.demo.policy import demo_policy
from agents.demo.tools import demo_tools
from agents.text_agent import TextActionAgent, TextActionAgentConfig
from envs.games import GuessNumber
from envs.step_env import StepEnvironmentAdapter
from envs.tool_env import ToolEnvironment
from rollout.errors import ExitReason
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta, Task
from rollout.runner import run_rollout

GAME = Task(task_id="g1", prompt="Play.", data={"kind": "guess_number", "target": 7, "high": 10})


def game_env():
    return StepEnvironmentAdapter(GuessNumber)


def test_step_environment_episode_sums_rewards_and_ends_when_done():
    agent = TextActionAgent(TextActionAgentConfig(parser="react"))
    model = ScriptedModel(policy=demo_policy, tasks={GAME.task_id: GAME})
    result = asyncio.run(run_rollout(GAME, agent, model, game_env(), meta=RequestMeta(rollout_id="g", task_id="g1")))
    assert result.exit_reason == ExitReason.ENVIRONMENT_DONE
    guesses = [a.arguments["number"] for s in result.trajectory.steps for a in s.actions]
    assert guesses == [5, 8, 6, 7]  # bisection on the hints it was given
    # three wrong guesses at -0.1 and the right one at +1.0
    assert result.reward == pytest.approx(0.7)
    assert result.summary.total_reward == pytest.approx(0.7)


@pytest.mark.parametrize(
    "parser,output",
    [
        ("json", '{"tool": "calculate", "parameters": {"expression": "2+3"}}'),
        ("react", 'Thought: add\nAction: calculate\nAction Input: {"expression": "2+3"}'),
        ("function_calls",
         '<function_calls>\n{"tool_name": "calculate", "parameters": {"expression": "2+3"}}\n</function_calls>'),
    ],
)
def test_each_text_format_runs_tools(parser, output):
    agent = TextActionAgent(TextActionAgentConfig(parser=parser))
    model = ScriptedModel([output, "Thought: done.\nFinal Answer: 5"])
    task = Task(task_id="c", prompt="add 2 and 3")
    result = asyncio.run(run_rollout(task, agent, model, ToolEnvironment(demo_tools())))
    assert result.exit_reason == ExitReason.NATURAL_COMPLETION
    assert result.trajectory.steps[0].observations[0].content == "5"
    assert result.trajectory.messages[0]["role"] == "system"
    assert "calculate" in result.trajectory.messages[0]["content"]  # tools described in the prompt
    assert result.trajectory.messages[3] == {"role": "user", "content": "Observation: 5"}


@pytest.mark.parametrize(
    "garbage",
    ["\udcff\udcfe not utf-8 \ufffd", "x" * 1_000_000, '{"tool": "calculate", "parameters": {"expression": ', ""],
    ids=["non-utf8", "1MB", "broken-json", "empty"],
)
def test_garbage_is_fed_back_as_format_errors_never_a_crash(garbage):
    agent = TextActionAgent(TextActionAgentConfig(parser="json"))
    model = ScriptedModel([garbage, garbage, garbage])
    result = asyncio.run(run_rollout(Task(task_id="g", prompt="x"), agent, model, ToolEnvironment(demo_tools())))
    assert result.status == "completed"
    assert result.exit_reason == ExitReason.FORMAT_ERRORS
    feedback = [m["content"] for m in result.trajectory.messages[3::2]]
    assert len(feedback) == 3 and all(feedback)  # each one was fed back
    assert all(s.format_error for s in result.trajectory.steps)
    result.model_dump_json()  # whatever the model sent, the trajectory can be written


def test_caller_driven_stepping():
    """A trainer owns generation: reset, step(output) -> turn, should_continue, summary."""
    agent = TextActionAgent(TextActionAgentConfig(parser="json", max_steps=3))

    async def drive():
        session = agent.session(ToolEnvironment(demo_tools()))
        opening = await session.reset(Task(task_id="c", prompt="What is (17*23)+4?"))
        assert opening[-1]["content"] == "What is (17*23)+4?"
        turns = []
        outputs = iter([
            '{"tool": "calculate", "parameters": {"expression": "17*23"}}',
            "not an action at all",
            '{"tool": "calculate", "parameters": {"expression": "391+4"}}',
            "never used",
        ])
        while session.should_continue():
            turns.append(await session.step(next(outputs)))
        return session, turns

    session, turns = asyncio.run(drive())
    assert [t.turn_number for t in turns] == [1, 2, 3]
    assert turns[0].observation == "391" and not turns[0].done
    assert turns[1].format_error and turns[1].actions == []
    assert turns[2].observation == "395"
    summary = session.summary()
    assert summary.num_turns == 3
    assert summary.num_tool_calls == 2 and summary.successful_tool_calls == 2
    assert summary.tools_used == ["calculate"]
    assert summary.format_errors == 1
    assert summary.exit_reason == ExitReason.STEP_LIMIT


def test_caller_driven_episode_reports_done_and_reward():
    agent = TextActionAgent(TextActionAgentConfig(parser="react"))

    async def drive():
        session = agent.session(game_env())
        await session.reset(GAME)
        turns = [await session.step(f"Action: guess\nAction Input: {n}") for n in (3, 7)]
        return session, turns

    session, turns = asyncio.run(drive())
    assert not turns[0].done and turns[0].reward == pytest.approx(-0.1)
    assert turns[1].done and turns[1].reward == pytest.approx(0.9)
    assert turns[1].exit_reason == ExitReason.ENVIRONMENT_DONE
    assert not session.should_continue()
