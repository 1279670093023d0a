"""Our SWE outputs (``<instance_id>.traj.json`` files, preds.json) against the ones mini-swe-agent 2.4.6 writes
itself. Its batch runner (``process_instance``: its DefaultAgent, its local environment, its test model with
replies parsed by its own text-action parser) runs five tiny tasks; our Mini-SWE agent gets the same scripted
replies and templates, and ``write_swe_outputs`` writes our files. They must match field by field (each known
difference is named where it is allowed), and mini-swe-agent's inspector must load ours and title them by instance.

mini-swe-agent is not in our venv: its litellm pulls boto3, whose botocore pins python-dateutil<3 and would
downgrade the one pandas uses. The session fixture ``mini_swe`` gives the python of a venv of its own
(``tests/foreign_venvs.py``: the pin of pyproject's ``mini-swe-agent`` extra without its dependencies, plus the
packages the modules used here import); where it cannot be built (no package index) the tests skip, or fail with
ROLLOUT_REQUIRE_MINI_SWE=1."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from foreign_venvs import run_function

from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
from cluster.run.swe_outputs import write_swe_outputs
from envs.runtimes.local import LocalRuntime
from envs.shell_env import ShellEnvironment
from rollout.errors import SUBMIT_SENTINEL
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta, Task
from rollout.runner import run_rollout
from rollout.store.run_dir import RunStore

MODEL = "scripted"
SYSTEM = "You are a scripted test agent."
OBSERVATION = "<returncode>{{ returncode }}</returncode>\n<output>\n{{ output }}</output>"
"""Ours, in the shape of mini-swe-agent's default observation template, so the two conversations are equal."""


def reply(command: str) -> str:
    return f"Running it.\n```bash\n{command}\n```"


CASES: dict[str, tuple[list[str], dict[str, Any], dict[str, Any]]] = {
    # instance id: (the model's replies, mini-swe-agent's agent config, ours)
    "demo__submitted-1": ([reply("echo hello > hello.txt"), reply("test -f missing.txt"),
                           reply(f"echo {SUBMIT_SENTINEL} && cat hello.txt")], {}, {}),
    "demo__format-1": (["no command here"] * 3, {}, {}),
    "demo__steps-1": ([reply("echo one"), reply("echo two")], {"step_limit": 1}, {"max_steps": 1}),
    "demo__time-1": ([reply("sleep 1.1"), reply("echo two")], {"wall_time_limit_seconds": 1}, {"time_limit": 1}),
    "demo__error-1": (["/raise"], {}, {}),  # the model call fails: RuntimeError("endpoint unreachable")
}
STATUS = {"demo__submitted-1": "Submitted", "demo__format-1": "RepeatedFormatError",
          "demo__steps-1": "LimitsExceeded", "demo__time-1": "TimeExceeded", "demo__error-1": "RuntimeError"}


# ---- the mini-swe-agent venv (``foreign_venvs.MINI_SWE``; the session fixture ``mini_swe`` gives its python) ------


def in_mini_swe(python: Path, function: Any, request: dict[str, Any], workdir: Path) -> Any:
    """``function(request)`` run in the mini-swe-agent venv, in ``workdir``, with a global config of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MSWEA_", "PYTHON"))}
    env.update(MSWEA_SILENT_STARTUP="1", MSWEA_GLOBAL_CONFIG_DIR=str(workdir / "mini-swe-agent-config"))
    return run_function(python, function, request, cwd=workdir, env=env)


# ---- what runs in that venv (standard library and minisweagent only) ---------------------------------------------


def run_reference_batch(request: dict) -> list[str]:
    """mini-swe-agent's own batch runner on each case; its scripted model parses each reply with mini-swe-agent's
    text-action parser (as its litellm_textbased model does), so a reply without one bash block is its FormatError."""
    from pathlib import Path

    from minisweagent.models.test_models import DeterministicModel, make_output
    from minisweagent.models.utils.actions_text import parse_regex_actions
    from minisweagent.run.benchmarks.swebench import process_instance
    from minisweagent.run.benchmarks.utils.batch_progress import RunBatchProgressManager

    class ScriptedTextModel(DeterministicModel):
        def query(self, messages, **kwargs):
            self.current_index += 1
            content = self.config.outputs[self.current_index]["content"]
            if content == "/raise":
                raise RuntimeError("endpoint unreachable")
            actions = parse_regex_actions(content, action_regex=r"```bash\s*\n(.*?)\n```",
                                          format_error_template="{{ error }}")
            return make_output(content, actions, cost=0.0)

    globals()["ScriptedTextModel"] = ScriptedTextModel  # the model class is named by its import path
    out = Path(request["out"])
    for case in request["cases"]:
        workspace = out.parent / "workspaces" / case["id"]
        workspace.mkdir(parents=True)
        config = {
            "model": {"model_class": "__main__.ScriptedTextModel", "model_name": request["model"],
                      "outputs": [{"role": "assistant", "content": c} for c in case["replies"]]},
            "environment": {"environment_class": "local", "cwd": str(workspace)},
            "agent": {"system_template": request["system"], "instance_template": "{{ task }}", **case["agent"]},
        }
        process_instance({"instance_id": case["id"], "problem_statement": case["task"]}, out, config,
                         RunBatchProgressManager(len(request["cases"])))
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def look_with_inspector(request: dict) -> list[dict]:
    """mini-swe-agent's trajectory inspector, headless, on the files of a directory (found as its command finds
    them): per trajectory, its title and the roles and text shown on each page."""
    import asyncio
    from pathlib import Path

    from minisweagent.models.utils.content_string import get_content_string
    from minisweagent.run.utilities.inspector import TrajectoryInspector

    app = TrajectoryInspector(sorted(Path(request["dir"]).rglob("*.traj.json")))

    async def look() -> list[dict]:
        seen = []
        async with app.run_test() as pilot:
            await pilot.pause()
            for _ in app.trajectory_files:
                seen.append({"title": app.title, "roles": [[m.get("role") for m in page] for page in app.steps],
                             "texts": [[get_content_string(m) for m in page] for page in app.steps]})
                await pilot.press("L")
                await pilot.pause()
        return seen

    return asyncio.run(look())


# ---- both sides ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(mini_swe, tmp_path_factory) -> Path:
    """The output directory of mini-swe-agent's batch run: ``preds.json``, ``<id>/<id>.traj.json``."""
    root = tmp_path_factory.mktemp("mini-swe-agent")
    cases = [{"id": ident, "task": f"Task {ident}", "replies": replies, "agent": theirs}
             for ident, (replies, theirs, _ours) in CASES.items()]
    files = in_mini_swe(mini_swe, run_reference_batch, {"out": str(root / "out"), "model": MODEL, "system": SYSTEM,
                                                        "cases": cases}, root)
    assert files == sorted(["preds.json", *(f"{i}/{i}.traj.json" for i in CASES)])
    return root / "out"


def fail_the_call(messages, ctx):
    raise RuntimeError("endpoint unreachable")


@pytest.fixture(scope="module")
def ours(tmp_path_factory) -> Path:
    """Our run directory after the same five tasks: results, trajectories, then ``write_swe_outputs``."""
    run_dir = tmp_path_factory.mktemp("ours") / "run"
    agent_section = {"type": "mini_swe", "system_template": SYSTEM, "instance_template": "{{ problem }}",
                     "observation_template": OBSERVATION}
    config = {"run_id": "ref", "agent": agent_section, "model": {"type": "scripted", "name": MODEL},
              "environment": {"type": "shell"}}
    store = RunStore(run_dir).open(config, {})
    for ident, (replies, _theirs, limits) in CASES.items():
        agent = MiniSweAgent(MiniSweAgentConfig(**{**agent_section, **limits}))
        model = ScriptedModel(policy=fail_the_call) if replies == ["/raise"] else ScriptedModel(replies)
        env = ShellEnvironment(LocalRuntime({}, trusted_model=True))
        meta = RequestMeta(rollout_id=f"{ident}#0", task_id=ident, run_id="ref")
        result = asyncio.run(run_rollout(Task(task_id=ident, prompt=f"Task {ident}"), agent, model, env,
                                         limits=agent.limits(), meta=meta))
        if result.status == "completed":  # what the SWE verifier adds (no grading here: the patch is the submission)
            details = {"tests_status": {}, "resolved": False, "model_patch": result.submission}
            result = result.model_copy(update={"reward": 0.0, "reward_details": details})
        store.append(result)
    write_swe_outputs(store, "ref", MODEL)
    store.close()
    return run_dir


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def without_format_error_replies(messages: list[dict]) -> list[dict]:
    """Known difference: mini-swe-agent keeps no reply it could not parse (its feedback message carries it as
    ``extra.model_response``); ours keeps the reply, as the model saw it in the conversation that followed."""
    return [m for i, m in enumerate(messages) if not (
        m["role"] == "assistant" and i + 1 < len(messages)
        and messages[i + 1].get("extra", {}).get("interrupt_type") == "FormatError")]


# ---- the comparison ------------------------------------------------------------------------------------------------


def test_the_files_are_where_mini_swe_agent_puts_them_and_preds_json_is_the_same(reference, ours):
    assert sorted(str(p.relative_to(ours / "trajectories")) for p in ours.rglob("*.traj.json")) == sorted(
        str(p.relative_to(reference)) for p in reference.rglob("*.traj.json"))
    # the same predictions, an empty patch "" (an uncaught error, a rollout that never submitted) included
    assert load(ours / "preds.json") == load(reference / "preds.json")
    assert load(ours / "preds.json")["demo__format-1"]["model_patch"] == ""


@pytest.mark.parametrize("ident", list(CASES))
def test_each_trajectory_matches_mini_swe_agent_field_by_field(reference, ours, ident):
    theirs = load(reference / ident / f"{ident}.traj.json")
    mine = load(ours / "trajectories" / ident / f"{ident}.traj.json")
    assert list(mine) == list(theirs) == ["info", "messages", "trajectory_format", "instance_id"]
    assert mine["trajectory_format"] == theirs["trajectory_format"] == "mini-swe-agent-1.1"
    assert mine["instance_id"] == theirs["instance_id"] == ident

    info, their_info = mine["info"], theirs["info"]
    assert list(info)[:len(their_info)] == list(their_info)  # theirs first, in their order; then ours
    assert their_info["mini_version"] == "2.4.6" and info["mini_version"] is None  # theirs wrote theirs; we wrote ours
    assert info["format_of"] == "mini-swe-agent 2.4.6" and info["written_by"].startswith("rollout-farm ")
    assert info["exit_status"] == their_info["exit_status"] == STATUS[ident]
    assert info["submission"] == their_info["submission"] == ("hello\n" if ident == "demo__submitted-1" else "")
    # known difference: mini-swe-agent counts a model call that raised; we record a step per reply received
    calls = their_info["model_stats"]["api_calls"] - (ident == "demo__error-1")
    assert info["model_stats"] == {**their_info["model_stats"], "api_calls": calls}
    assert list(info["config"])[:6] == list(their_info["config"]) == [
        "agent", "agent_type", "model", "model_type", "environment", "environment_type"]
    assert info["config"]["agent"]["system_template"] == their_info["config"]["agent"]["system_template"] == SYSTEM
    assert info["config"]["agent_type"] == "agents.swe_agent.MiniSweAgent"  # each its own class, by import path
    assert info["config"]["environment_type"] == "envs.shell_env.ShellEnvironment"
    if ident == "demo__error-1":
        assert info["exception_str"] == their_info["exception_str"] == "endpoint unreachable"
        assert "RuntimeError: endpoint unreachable" in info["traceback"]
        assert "RuntimeError: endpoint unreachable" in their_info["traceback"]

    messages, their_messages = without_format_error_replies(mine["messages"]), theirs["messages"]
    assert [m["role"] for m in messages] == [m["role"] for m in their_messages]
    for m, t in zip(messages, their_messages):
        assert set(t) <= set(m) and isinstance(m["content"], str)
        extra, their_extra = m.get("extra", {}), t.get("extra", {})
        # known difference: we cannot count the actions in a reply we could not parse (n_actions)
        assert set(their_extra) - {"n_actions"} <= set(extra), (m["role"], their_extra.keys(), extra.keys())
        if their_extra.get("interrupt_type") == "FormatError":  # our parser's words, and our template's
            assert extra["interrupt_type"] == "FormatError" and extra["model_response"] == t["extra"]["model_response"]
            continue
        assert m["content"] == t["content"], m["role"]
        for key in their_extra.keys() - {"timestamp", "traceback"}:
            assert extra[key] == their_extra[key], (m["role"], key)
        if "timestamp" in their_extra:
            assert isinstance(extra["timestamp"], float)
    stamps = [m["extra"]["timestamp"] for m in mine["messages"] if "timestamp" in m.get("extra", {})]
    assert stamps == sorted(stamps)


def test_mini_swe_agents_inspector_shows_ours_as_it_shows_its_own(mini_swe, reference, ours, tmp_path):
    seen = in_mini_swe(mini_swe, look_with_inspector, {"dir": str(ours / "trajectories")}, tmp_path)
    their_view = in_mini_swe(mini_swe, look_with_inspector, {"dir": str(reference)}, tmp_path)
    assert len(seen) == len(their_view) == len(CASES)
    for page, theirs, ident in zip(seen, their_view, sorted(CASES)):
        assert page["title"].startswith("Trajectory ") and f" - {ident}.traj.json - Step 1/" in page["title"]
        assert page["title"].split(" - ")[1] == theirs["title"].split(" - ")[1]
        if ident != "demo__format-1":  # ours has a page per reply it could not parse
            assert page["roles"] == theirs["roles"] and page["texts"] == theirs["texts"]
    submitted = seen[sorted(CASES).index("demo__submitted-1")]
    assert submitted["roles"][-1] == ["assistant", "exit"] and submitted["texts"][-1][-1] == "hello\n"
