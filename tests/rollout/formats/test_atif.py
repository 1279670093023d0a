"""A rollout as an ATIF document and an SFT row, for every kind of agent the farm has: the real loops with the
scripted model (its fake token ids and logprobs), an external agent's calls as the gateway's call store records
them. What a reader of the file sees: steps 1..n, the prompt as system/user steps, one agent step per model call
carrying that call's own token data, tool calls answered by their observations, context the model did not produce
marked ``is_copied_context``, the reward in the final metrics. Harbor's own models read these files in
``test_atif_harbor.py``."""

from __future__ import annotations

import asyncio
import json

import pytest

from agents.demo.tools import demo_tools
from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
from agents.text_agent import TextActionAgent, TextActionAgentConfig
from agents.tool_agent import ToolCallingAgent, ToolCallingAgentConfig
from cluster.gateway.call_store import CallStore
from envs.runtimes.local import LocalRuntime
from envs.shell_env import ShellEnvironment
from envs.tool_env import ToolEnvironment
from rollout.errors import SUBMIT_SENTINEL, ExitReason
from rollout.formats.atif import AtifAgent, to_atif
from rollout.formats.export import export_run
from rollout.formats.sharegpt import trace_row
from rollout.models.scripted import ScriptedModel, fake_response, to_message
from rollout.records import RequestMeta, RolloutResult, Task, Trajectory, Usage
from rollout.runner import run_rollout
from rollout.store.run_dir import RunStore
from rollout.wire.gateway_calls import calls_to_steps

AGENT = AtifAgent(name="test-agent", version="0", model_name="scripted")


def run(agent, env, outputs, task=None):
    task = task or Task(task_id="t", prompt="do it")
    meta = RequestMeta(rollout_id=f"{task.task_id}#0", task_id=task.task_id, run_id="unit")
    result = asyncio.run(run_rollout(task, agent, ScriptedModel(outputs), env, limits=agent.limits(), meta=meta))
    assert result.status == "completed", result.error
    return result


def checked(result):
    """The document, with what every reader relies on checked: steps 1..n, each observation result pointing at a
    tool call of its own step, model-only fields on agent steps only, no null written."""
    doc = to_atif(result, AGENT)
    assert doc["schema_version"] == "ATIF-v1.8"
    assert [s["step_id"] for s in doc["steps"]] == list(range(1, len(doc["steps"]) + 1))
    for step in doc["steps"]:
        ids = {c["tool_call_id"] for c in step.get("tool_calls") or []}
        for found in (step.get("observation") or {}).get("results", []):
            assert found.get("source_call_id", next(iter(ids), None)) in ids | {None}
        if step["source"] != "agent":
            assert not {"tool_calls", "metrics", "llm_call_count"} & set(step)
    assert "null" not in json.dumps([{k: v for k, v in s.items() if k != "extra"} for s in doc["steps"]])
    assert doc["final_metrics"]["total_steps"] == len(doc["steps"])
    return doc


def own(doc):
    """The agent steps that are this rollout's model calls."""
    return [s for s in doc["steps"] if s["source"] == "agent" and not s.get("is_copied_context")]


def assert_token_data_is_the_runs(doc, result):
    steps = own(doc)
    assert len(steps) == len(result.trajectory.steps) and [s["extra"]["turn"] for s in steps] == list(
        range(1, len(steps) + 1))
    for atif, step in zip(steps, result.trajectory.steps):
        assert step.prompt_token_ids and step.completion_token_ids and step.logprobs  # the scripted model's
        assert atif["metrics"]["prompt_token_ids"] == step.prompt_token_ids
        assert atif["metrics"]["completion_token_ids"] == step.completion_token_ids
        assert atif["metrics"]["logprobs"] == step.logprobs
        assert atif["metrics"]["prompt_tokens"] == step.usage.prompt_tokens and atif["llm_call_count"] == 1
    totals = doc["final_metrics"]
    assert totals["total_prompt_tokens"] == result.usage.prompt_tokens
    assert totals["total_completion_tokens"] == result.usage.completion_tokens
    assert totals["extra"]["total_tokens"] == result.usage.total_tokens
    assert totals["extra"]["model_calls"] == len(result.trajectory.steps)


def shown_after(result, turn):
    """The messages the model was shown after its reply of ``turn`` (up to its next reply)."""
    messages = result.trajectory.messages
    at = next(i for i, m in enumerate(messages) if m is result.trajectory.steps[turn - 1].message
              or m == result.trajectory.steps[turn - 1].message)
    rest = messages[at + 1:]
    return [m["content"] for m in rest[: next((i for i, m in enumerate(rest) if m["role"] == "assistant"),
                                              len(rest))]]


def test_the_bash_agent_one_command_per_turn_as_the_model_saw_it(tmp_path):
    env = ShellEnvironment(LocalRuntime({"allow_host_exec": True, "root": str(tmp_path)}))
    replies = ["Let me think first.", "Look:\n```bash\necho hi\n```",
               f"Submit:\n```bash\necho {SUBMIT_SENTINEL} && echo patch\n```"]
    result = run(MiniSweAgent(MiniSweAgentConfig()), env, replies)
    assert result.exit_reason == ExitReason.SUBMITTED
    doc = checked(result)
    assert [s["source"] for s in doc["steps"]] == ["system", "user", "agent", "agent", "agent"]
    assert [s["message"] for s in own(doc)] == replies  # the text as written: the command stays in it
    assert not any("tool_calls" in s for s in doc["steps"])  # text actions are no native tool calls
    assert [a["arguments"]["command"] for s in own(doc)[1:] for a in s["extra"]["actions"]] == [
        "echo hi", f"echo {SUBMIT_SENTINEL} && echo patch"]
    first, second, last = own(doc)
    assert first["extra"]["format_error"] and "format_error" not in second["extra"]
    assert [r["content"] for r in first["observation"]["results"]] == shown_after(result, 1)  # the feedback
    assert [r["content"] for r in second["observation"]["results"]] == shown_after(result, 2)
    assert "<returncode>0</returncode>" in second["observation"]["results"][0]["content"]
    assert "source_call_id" not in second["observation"]["results"][0]  # no tool calling format here
    [submitted] = last["observation"]["results"]  # nothing went back to the model: the recorded output
    assert submitted["content"].endswith("patch\n") and submitted["extra"]["shown_to_model"] is False
    assert last["extra"]["exit_reason"] == "submitted"
    assert_token_data_is_the_runs(doc, result)
    assert doc["final_metrics"]["extra"]["format_errors"] == 1
    assert doc["extra"]["exit_reason"] == "submitted" and doc["extra"]["submission"] == "patch\n"
    assert doc["agent"] == {"name": "test-agent", "version": "0", "model_name": "scripted"}


def call(*pairs):
    return {"tool_calls": [{"name": name, "arguments": arguments} for name, arguments in pairs]}


def test_the_tool_calling_agent_each_call_answered_by_its_observation():
    outputs = [call(("calculate", {"expression": "1+1"}), ("calculate", {"expression": "2+2"})),
               call(("calculate", "{not json")), "It is 4."]
    result = run(ToolCallingAgent(ToolCallingAgentConfig(system_prompt="Use the tools.")),
                 ToolEnvironment(demo_tools()), outputs)
    doc = checked(result)
    assert doc["agent"]["tool_definitions"] == result.trajectory.tools and result.trajectory.tools
    two, bad, answer = own(doc)
    assert [c["arguments"] for c in two["tool_calls"]] == [{"expression": "1+1"}, {"expression": "2+2"}]
    assert [r["source_call_id"] for r in two["observation"]["results"]] == [c["tool_call_id"] for c in
                                                                          two["tool_calls"]]
    assert [r["content"] for r in two["observation"]["results"]] == ["2", "4"]
    # arguments that are not JSON: an empty object, the text kept; the format error still answers the call
    assert bad["tool_calls"][0]["arguments"] == {} and bad["tool_calls"][0]["extra"] == {"raw_arguments": "{not json"}
    assert bad["observation"]["results"][0]["source_call_id"] == bad["tool_calls"][0]["tool_call_id"]
    assert answer["message"] == "It is 4." and "observation" not in answer and "tool_calls" not in answer
    assert_token_data_is_the_runs(doc, result)


def test_the_text_action_agent_keeps_its_react_text_and_lists_its_actions():
    outputs = ['Thought: add\nAction: calculate\nAction Input: {"expression": "2+3"}', "Final Answer: 5"]
    result = run(TextActionAgent(TextActionAgentConfig(parser="react")), ToolEnvironment(demo_tools()), outputs)
    doc = checked(result)
    action, answer = own(doc)
    assert action["message"] == outputs[0] and "tool_calls" not in action
    assert action["extra"]["actions"] == [{"kind": "tool", "name": "calculate", "arguments": {"expression": "2+3"},
                                           "call_id": None}]
    assert action["observation"]["results"] == [{"content": "Observation: 5", "extra": {"role": "user"}}]
    assert answer["extra"]["exit_reason"] == "natural_completion"
    assert_token_data_is_the_runs(doc, result)


def test_a_tasks_few_shot_turns_are_copied_context_and_no_row_ends_on_them():
    task = Task(task_id="shots", messages=[
        {"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}])
    result = run(ToolCallingAgent(ToolCallingAgentConfig()), ToolEnvironment(demo_tools()), ["6"], task)
    doc = checked(result)
    assert [(s["source"], s["message"], s.get("is_copied_context")) for s in doc["steps"]] == [
        ("system", "Answer with a number.", None), ("user", "2+2?", None), ("agent", "4", True),
        ("user", "3+3?", None), ("agent", "6", None)]
    assert "metrics" not in doc["steps"][2] and "llm_call_count" not in doc["steps"][2]
    assert "is_copied_context" in doc["notes"]
    row = trace_row(doc)
    assert row["episode"] == "episode-0" and row["conversations"][-1] == {"role": "assistant", "content": "6"}
    assert_token_data_is_the_runs(doc, result)


def gateway_calls(conversations):
    """What the gateway's call store records for one rollout's calls (each conversation a prompt; the scripted
    model's replies and fake token data)."""
    store = CallStore()
    for messages in conversations:
        message, finish = to_message(f"echo {len(messages)}")
        response = fake_response(messages, message, finish)
        store.record("x#0", {"messages": messages, "message": response.message, "tools": None,
                             "finish_reason": finish, "usage": response.usage.model_dump(), "started_at": 1.0e9,
                             "seconds": 0.1, "prompt_token_ids": response.prompt_token_ids,
                             "completion_token_ids": response.completion_token_ids, "logprobs": response.logprobs})
    recorded = calls_to_steps(store.calls("x#0"))
    trajectory = Trajectory(messages=recorded.messages, tools=recorded.tools, steps=recorded.steps,
                            exit_reason=ExitReason.NATURAL_COMPLETION)
    return RolloutResult(run_id="unit", rollout_id="x#0", task_id="x", status="completed",
                         exit_reason=ExitReason.NATURAL_COMPLETION, trajectory=trajectory,
                         usage=sum((s.usage for s in recorded.steps), start=Usage()))


SYSTEM = {"role": "system", "content": "You are an outside agent."}


def test_an_external_agents_calls_one_conversation():
    first = [SYSTEM, {"role": "user", "content": "task"}]
    second = [*first, {"role": "assistant", "content": "echo 2"}, {"role": "user", "content": "result 1"}]
    third = [*second, {"role": "assistant", "content": "echo 4"}, {"role": "user", "content": "result 2"}]
    result = gateway_calls([first, second, third])
    doc = checked(result)
    assert [(s["source"], s["message"]) for s in doc["steps"]] == [
        ("system", "You are an outside agent."), ("user", "task"), ("agent", "echo 2"), ("agent", "echo 4"),
        ("agent", "echo 6")]
    assert [[r["content"] for r in s.get("observation", {}).get("results", [])] for s in own(doc)] == [
        ["result 1"], ["result 2"], []]
    assert not any(s.get("is_copied_context") for s in doc["steps"])
    assert "token_breaks" not in doc["final_metrics"]["extra"]
    assert_token_data_is_the_runs(doc, result)


def test_an_external_agents_compacted_prompt_its_resent_context_is_copied():
    first = [SYSTEM, {"role": "user", "content": "a long task"}]
    second = [*first, {"role": "assistant", "content": "echo 2"}, {"role": "user", "content": "go on"}]
    compacted = [SYSTEM, {"role": "user", "content": "summary: a long task, going on"}]
    fourth = [*compacted, {"role": "assistant", "content": "echo 2"}, {"role": "user", "content": "next"}]
    result = gateway_calls([first, second, compacted, fourth])
    doc = checked(result)
    assert [(s["source"], s["message"], s.get("is_copied_context")) for s in doc["steps"]] == [
        ("agent", "echo 2", None), ("agent", "echo 4", None),  # the first conversation: its replies, recorded
        ("system", "You are an outside agent.", True), ("user", "summary: a long task, going on", True),
        ("agent", "echo 2", None), ("agent", "echo 4", None)]
    assert doc["steps"][0]["observation"]["results"][0]["content"] == "go on"  # what its continuation added
    assert doc["steps"][4]["observation"]["results"][0] == {"content": "next", "extra": {"role": "user"}}
    [broken] = doc["final_metrics"]["extra"]["token_breaks"]
    assert broken["turn"] == 3 and doc["steps"][4]["extra"]["token_break"]["expected"] == broken["expected"]
    assert_token_data_is_the_runs(doc, result)


def test_sft_rows_in_the_shape_of_harbors_trace_export():
    outputs = [call(("calculate", {"expression": "6*7"})), "It is 42."]
    result = run(ToolCallingAgent(ToolCallingAgentConfig(system_prompt="Use the tools.")),
                 ToolEnvironment(demo_tools()), outputs)
    row = trace_row(checked(result))
    assert [m["role"] for m in row["conversations"]] == ["user", "user", "assistant", "user", "assistant"]
    system = row["conversations"][0]["content"]
    assert system.startswith("<tools>\n") and system.endswith("</tools>\n\nUse the tools.")
    assert json.loads(system[len("<tools>\n"):system.index("\n</tools>")]) == result.trajectory.tools
    assert row["conversations"][2]["content"] == (
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "6*7"}}\n</tool_call>')
    assert row["conversations"][3]["content"] == "42" and row["conversations"][4]["content"] == "It is 42."
    assert [m["from"] for m in row["conversations_sharegpt"]] == ["human", "human", "gpt", "human", "gpt"]
    assert (row["agent"], row["model"], row["task"], row["trial_name"], row["run_id"], row["episode"]) == (
        "test-agent", "scripted", "t", "t#0", "unit", "episode-1")
    assert row["result"] == str(float(result.reward))
    assert "conversations_sharegpt" not in trace_row(checked(result), sharegpt=False)


def test_a_rollout_that_recorded_nothing_has_no_document_and_the_export_says_so(tmp_path):
    empty = RolloutResult(rollout_id="gone#0", task_id="gone", status="infra_failed",
                          exit_reason=ExitReason.INTERNAL_ERROR)
    assert to_atif(empty) is None
    with RunStore(tmp_path / "run").acquire() as store:
        store.append(empty)
    done = export_run(tmp_path / "run", "atif", tmp_path / "out", lambda r: AGENT)
    assert done.paths == [] and done.skipped == [("gone#0", "no message recorded")]
    with pytest.raises(ValueError, match="unknown format"):
        export_run(tmp_path / "run", "csv", tmp_path / "out", lambda r: AGENT)
