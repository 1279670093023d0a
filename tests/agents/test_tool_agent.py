"""The tool-calling agent driven by the scripted model: every way it ends, and context across rounds."""

import asyncio
import json
import pickle

import pytest

from agents.demo.policy import demo_policy
from agents.demo.tools import demo_tools
from agents.tool_agent import ToolCallingAgent, ToolCallingAgentConfig
from agents.tools.registry import ToolRegistry
from agents.tools.tool import FunctionTool, ToolParameter
from envs.tool_env import ToolEnvironment
from envs.verifiers import AnswerMatchVerifier
from rollout.errors import ExitReason
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta, RolloutResult, Task
from rollout.runner import run_rollout


def call(name, **arguments):
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def run(outputs, config=None, tools=None, task=None, verifier=None, **agent_kw):
    task = task or Task(task_id="t1", prompt="compute")
    agent = ToolCallingAgent(config or ToolCallingAgentConfig(**agent_kw))
    env = ToolEnvironment(tools or demo_tools())
    model = outputs if isinstance(outputs, ScriptedModel) else ScriptedModel(outputs)
    return asyncio.run(
        run_rollout(task, agent, model, env, verifier=verifier, limits=agent.limits(),
                    meta=RequestMeta(rollout_id="r1", task_id=task.task_id))
    )


def test_natural_completion_after_a_tool_round():
    result = run([call("calculate", expression="6*7"), "It is 42."])
    assert result.status == "completed"
    assert result.exit_reason == ExitReason.NATURAL_COMPLETION
    assert result.submission == "It is 42."
    tool_msgs = [m for m in result.trajectory.messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["42"]
    # the tool reply answers the call id the model used
    call_id = result.trajectory.messages[1]["tool_calls"][0]["id"]
    assert tool_msgs[0]["tool_call_id"] == call_id
    assert result.trajectory.tools and result.trajectory.tools[0]["type"] == "function"


def test_all_calls_of_a_round_run_before_the_next_model_call():
    two = {"tool_calls": [{"name": "calculate", "arguments": {"expression": "1+1"}},
                          {"name": "calculate", "arguments": {"expression": "2+2"}}]}
    result = run([two, "done"])
    step = result.trajectory.steps[0]
    assert [o.content for o in step.observations] == ["2", "4"]
    roles = [m["role"] for m in result.trajectory.messages]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]
    summary = result.summary
    assert (summary.num_turns, summary.num_tool_calls, summary.successful_tool_calls) == (2, 2, 2)
    assert summary.tools_used == ["calculate"]


def test_step_limit():
    result = run([call("calculate", expression="1")] * 5, max_steps=3)
    assert result.exit_reason == ExitReason.STEP_LIMIT
    assert len(result.trajectory.steps) == 3
    assert result.status == "completed" and result.reward == 0.0


def test_finish_reason_length_is_token_limit_and_keeps_the_cut_output():
    result = run([{"content": "a very long answ", "finish_reason": "length"}])
    assert result.exit_reason == ExitReason.TOKEN_LIMIT
    assert result.trajectory.messages[-1]["content"] == "a very long answ"
    assert result.trajectory.steps[-1].termination_reason == ExitReason.TOKEN_LIMIT


def test_context_length_rejection_is_a_task_outcome():
    result = run([call("calculate", expression="1"), {"error": "context_length"}])
    assert result.status == "completed"
    assert result.exit_reason == ExitReason.TOKEN_LIMIT
    assert result.error is None


def test_context_window_of_the_scripted_model_ends_with_token_limit():
    model = ScriptedModel([call("calculate", expression="1+1")] * 10, context_window=40)
    result = run(model)
    assert result.exit_reason == ExitReason.TOKEN_LIMIT
    assert 1 <= len(result.trajectory.steps) < 10


def test_total_token_budget():
    result = run([call("calculate", expression="1")] * 10, max_total_tokens=30)
    assert result.exit_reason == ExitReason.TOKEN_LIMIT


def test_wall_clock_limit():
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slept"

    tools = ToolRegistry([FunctionTool(slow, [ToolParameter("seconds", "number")])])
    result = run([call("slow", seconds=0.3)] * 10, tools=tools, time_limit=0.5)
    assert result.exit_reason == ExitReason.TIME_LIMIT
    assert 1 <= len(result.trajectory.steps) <= 3


@pytest.mark.parametrize(
    "bad_output",
    [
        call("no_such_tool"),
        call("calculate", wrong_arg="1"),
        {"tool_calls": [{"name": "calculate", "arguments": "{not json"}]},
    ],
    ids=["unknown_tool", "invalid_arguments", "broken_json"],
)
def test_repeated_format_errors_end_the_rollout(bad_output):
    result = run([bad_output] * 5)
    assert result.exit_reason == ExitReason.FORMAT_ERRORS
    assert len(result.trajectory.steps) == 3  # default max_consecutive_format_errors
    # every error was fed back to the model as the reply to its call
    replies = [m for m in result.trajectory.messages if m["role"] == "tool"]
    assert len(replies) >= 2 and all(m["tool_call_id"] for m in replies)


def test_format_errors_reset_after_a_good_round():
    bad = call("no_such_tool")
    good = call("calculate", expression="2")
    result = run([bad, bad, good, bad, bad, "done"])
    assert result.exit_reason == ExitReason.NATURAL_COMPLETION


def test_error_observations_carry_the_registry_texts():
    result = run([call("nope"), call("calculate", expression="1/0"), "giving up"])
    contents = [m["content"] for m in result.trajectory.messages if m["role"] == "tool"]
    assert contents == ["Tool 'nope' not found", "Tool execution error: division by zero"]
    assert result.summary.successful_tool_calls == 0


@pytest.mark.parametrize("policy,expected", [("continue", ExitReason.NATURAL_COMPLETION),
                                             ("stop", ExitReason.ALL_TOOLS_FAILED)])
def test_all_tools_failed_policy(policy, expected):
    failing = call("calculate", expression="1/0")
    result = run([failing, "ok then"], on_all_tools_failed=policy)
    assert result.exit_reason == expected
    assert result.status == "completed"


def test_two_rounds_second_call_uses_first_result_and_is_rewarded():
    task = Task(task_id="course-1", prompt="Which other course covers lesson 4 of Building Agents with Tools?",
                data={"kind": "course_topic", "course": "Building Agents with Tools", "lesson": 4,
                      "answer": "Containers for Researchers"})
    model = ScriptedModel(policy=demo_policy, tasks={task.task_id: task})
    result = run(model, task=task, verifier=AnswerMatchVerifier())
    calls = [a for s in result.trajectory.steps for a in s.actions]
    assert [a.name for a in calls] == ["get_course_outline", "search_course_content"]
    # "Sandboxing shell commands" is only known from the first tool's result
    assert calls[1].arguments["query"] == "Sandboxing shell commands"
    assert result.exit_reason == ExitReason.NATURAL_COMPLETION
    assert result.reward == 1.0
    # the whole conversation went to the model each round (the list only grows)
    assert len(result.trajectory.messages) == 6


def test_token_data_is_carried_into_each_step():
    result = run([call("calculate", expression="2*3"), "six"])
    for step in result.trajectory.steps:
        assert step.completion_token_ids and len(step.completion_token_ids) == len(step.logprobs)
        assert step.prompt_token_ids and step.usage.prompt_tokens == len(step.prompt_token_ids)
    first, second = result.trajectory.steps
    # append-only conversation: the second prompt starts with the first prompt
    assert second.prompt_token_ids[: len(first.prompt_token_ids)] == first.prompt_token_ids


def test_result_survives_json_and_pickle_round_trips_unchanged():
    result = run([call("calculate", expression="6*7"), "It is 42."])
    again = RolloutResult.model_validate_json(result.model_dump_json())
    assert again == result
    assert pickle.loads(pickle.dumps(result)) == result
    json.loads(result.model_dump_json())  # plain JSON, no custom types


def test_every_request_carries_the_rollout_identity():
    model = ScriptedModel([call("calculate", expression="1"), "done"])
    task = Task(task_id="t9", prompt="x")
    agent = ToolCallingAgent()
    meta = RequestMeta(rollout_id="run/t9/2/a1", task_id="t9", sample_index=2, attempt=1)
    asyncio.run(run_rollout(task, agent, model, ToolEnvironment(demo_tools()), meta=meta))
    assert list(model.requests) == [meta, meta]
