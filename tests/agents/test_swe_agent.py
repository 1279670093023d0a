"""The Mini-SWE bash agent: one command per turn, submission by sentinel, elided observations."""

import asyncio
import pickle

import pytest

from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
from envs.runtimes.local import LocalRuntime, LocalRuntimeConfig
from envs.runtimes.null import NullRuntime, NullRuntimeConfig
from envs.shell_env import ShellEnvironment
from rollout.errors import ExitReason
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta, RolloutResult, Task
from rollout.runner import run_rollout

TASK = Task(task_id="s1", prompt="Create hello.txt containing hello.")
SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def bash(cmd):
    return f"I will run it.\n```bash\n{cmd}\n```"


def run(outputs, runtime=None, env_config=None, **cfg):
    runtime = runtime or LocalRuntime(LocalRuntimeConfig(), trusted_model=True)
    agent = MiniSweAgent(MiniSweAgentConfig(**cfg))
    env = ShellEnvironment(runtime, env_config)
    return asyncio.run(run_rollout(TASK, agent, ScriptedModel(outputs), env, limits=agent.limits(),
                                   meta=RequestMeta(rollout_id="r", task_id=TASK.task_id)))


def test_submission_is_the_output_after_the_sentinel_line():
    result = run([bash("echo hello > hello.txt"), bash(f"echo {SENTINEL} && cat hello.txt")])
    assert result.exit_reason == ExitReason.SUBMITTED
    assert result.submission == "hello\n"
    assert result.trajectory.submission == "hello\n"
    system, instance = result.trajectory.messages[:2]
    assert system["role"] == "system" and "ONE bash code block" in system["content"]
    assert TASK.prompt in instance["content"] and SENTINEL in instance["content"]
    assert "<returncode>0</returncode>" in result.trajectory.messages[3]["content"]


def test_sentinel_not_on_the_first_line_does_not_submit():
    result = run([bash(f"echo hi && echo {SENTINEL}"), bash(f"echo {SENTINEL}")])
    assert len(result.trajectory.steps) == 2
    assert result.exit_reason == ExitReason.SUBMITTED


@pytest.mark.parametrize("reply", ["no code block here", bash("ls") + "\n" + bash("pwd"), "\udcff" + "z" * 1_000_000],
                         ids=["zero-blocks", "two-blocks", "garbage-1MB"])
def test_format_errors_are_fed_back_then_end_the_rollout(reply):
    result = run([reply] * 3)
    assert result.exit_reason == ExitReason.FORMAT_ERRORS
    feedback = [m["content"] for m in result.trajectory.messages if m["role"] == "user"][1:]
    assert len(feedback) == 3 and all("exactly ONE bash code block" in f for f in feedback)


def test_failed_command_is_output_not_an_exception():
    result = run([bash("ls /definitely/not/here"), bash(f"echo {SENTINEL}")])
    obs = result.trajectory.messages[3]["content"]
    assert "<returncode>2</returncode>" in obs and "No such file" in obs
    assert result.exit_reason == ExitReason.SUBMITTED


def test_long_output_keeps_head_and_tail_and_says_what_was_elided():
    result = run([bash("seq 1 100000"), bash(f"echo {SENTINEL}")], max_observation_chars=200)
    obs = result.trajectory.messages[3]["content"]
    assert obs.startswith("<returncode>0</returncode>")
    assert "\n1\n2\n3\n" in obs and "99999\n100000" in obs
    assert "characters elided" in obs
    assert len(obs) < 1000


def test_command_timeout_is_reported_to_the_model():
    result = run([bash("sleep 30"), bash(f"echo {SENTINEL}")], env_config={"command_timeout": 1}, command_timeout=1)
    assert "timed out" in result.trajectory.messages[3]["content"]
    assert result.trajectory.steps[0].observations[0].info["timed_out"] is True


def test_strict_templates_name_the_bad_field():
    result = run([bash("true")], instance_template="{{ no_such_variable }}")
    assert result.status == "infra_failed"  # a config error found mid-run is never scored
    assert "agent.instance_template" in result.error.message


def test_scripted_rollout_on_the_null_runtime_round_trips():
    runtime = NullRuntime(NullRuntimeConfig(echo=False, output=f"{SENTINEL}\ndiff --git a/x b/x\n"))
    result = run([bash("git diff")], runtime=runtime)
    assert result.exit_reason == ExitReason.SUBMITTED
    assert result.submission == "diff --git a/x b/x\n"
    assert RolloutResult.model_validate_json(result.model_dump_json()) == result
    assert pickle.loads(pickle.dumps(result)) == result


def test_templates_render_as_jinja_renders_them_and_a_missing_variable_names_its_field():
    import jinja2

    from agents import swe_prompts
    from rollout.errors import ConfigError

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    cases = [
        (swe_prompts.OBSERVATION_TEMPLATE, dict(returncode=2, timed_out=True, timeout=5, truncated=False, elided=0,
                                                output="a\nb", head="", tail="", output_limit=10)),
        (swe_prompts.OBSERVATION_TEMPLATE, dict(returncode=0, timed_out=False, timeout=5, truncated=True, elided=7,
                                                output="x" * 30, head="xx", tail="yy", output_limit=10)),
        (swe_prompts.INSTANCE_TEMPLATE, dict(task={"data": {"repo": "o/r"}}, cwd="/w", problem="fix it <b>",
                                             sentinel="DONE", submit_command="echo DONE")),
        ("{% for i in range(n) %}{{ i }},{% endfor %}{{ name | upper }}{{ none }}", dict(n=3, name="ab", none=None)),
    ]
    for source, variables in cases:
        assert swe_prompts.render(source, "f", **variables) == env.from_string(source).render(**variables)
    with pytest.raises(ConfigError) as caught:
        swe_prompts.render("{{ returncode }} {{ missing }}", "agent.observation_template", returncode=0)
    assert "missing" in str(caught.value) and caught.value.field == "agent.observation_template"
