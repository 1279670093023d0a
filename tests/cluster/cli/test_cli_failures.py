"""`rollout run` when things fail, in subprocesses: model outages against the time limit, non-retryable
failures, the exit code of a run that did nothing, and the checks that run before the run directory exists."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "local_demo.yaml"
SHELL_TASK = "dataset.slice=0:1"  # shell-hello: the Mini-SWE agent in a local workspace


def rollout(home, *args, backend="local", timeout=180):
    env = {**os.environ, "ROLLOUT_HOME": str(home)}
    if backend == "ray":  # its own embedded cluster, one CPU: results come back over the Ray wire
        env.pop("RAY_ADDRESS", None)
        args = (*args, "farm.num_cpus=1")
    where = ["--local"] if backend == "local" else []
    return subprocess.run([sys.executable, "-m", "cluster", "run", *where, *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def lines(run_dir):
    path = run_dir / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_a_model_that_never_answers_is_an_infra_failure_not_the_time_limit(tmp_path):
    out = rollout(tmp_path, str(DEMO), SHELL_TASK, "run.samples=1", "run.max_attempts=1", "agent.time_limit=2",
                  "model.max_retries=20", "serve.faults.fail_first_n=1000", "serve.faults.status=503")
    [result] = lines(tmp_path / "local_demo")
    assert (result["status"], result["exit_reason"]) == ("infra_failed", "model_error"), result["error"]
    assert result["reward"] is None
    assert out.returncode == 3, out.stderr
    summary = json.loads((tmp_path / "local_demo" / "summary.json").read_text())
    assert summary["infra_failures"]["by_exit_reason"] == {"model_error": 1}
    message = result["error"]["message"]
    assert "model_time_limit=2s" in message
    assert f"ModelError: {message}" in out.stdout  # the first message of each error type, not only counts


def test_time_spent_in_model_calls_is_not_the_agents(tmp_path):
    # every completion takes 0.4 s: three turns of model time pass the 1 s limit, the agent's own time does not
    # (the model's calls have their own budget, model_time_limit)
    out = rollout(tmp_path, str(DEMO), SHELL_TASK, "run.samples=1", "agent.time_limit=1", "serve.latency=0.4",
                  "agent.model_time_limit=60")
    assert out.returncode == 0, out.stderr
    [result] = lines(tmp_path / "local_demo")
    assert (result["status"], result["exit_reason"], result["reward"]) == ("completed", "submitted", 1.0)


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_non_retryable_failure_runs_once_and_stays_final_on_resume(tmp_path, backend):
    if backend == "ray":
        pytest.importorskip("ray")
    rows = [json.loads(line) for line in (REPO / "configs" / "data" / "local_demo.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["task_id"] == "tools-course-topic")
    del row["answer"]
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps(row) + "\n")
    config = tmp_path / "local_demo.yaml"
    config.write_text(DEMO.read_text().replace("data/local_demo.jsonl", str(data)))

    out = rollout(tmp_path, str(config), "run.samples=1", "run.max_attempts=3", backend=backend)
    results = lines(tmp_path / "local_demo")
    assert [(r["attempt"], r["status"], r["exit_reason"]) for r in results] == [(1, "infra_failed", "verifier_error")]
    assert results[0]["error"]["retryable"] is False and len(results[0]["attempts"]) == 1
    assert out.returncode == 3
    assert "has no data.answer" in out.stdout

    again = rollout(tmp_path, str(config), "run.samples=1", "run.max_attempts=3")
    assert again.returncode == 3 and len(lines(tmp_path / "local_demo")) == 1, again.stderr


def real_model_config(tmp_path, **runtime) -> Path:
    """The demo with a real model endpoint (no scripted server) that nothing listens on."""
    config = yaml.safe_load(DEMO.read_text())
    del config["serve"]
    config["model"]["base_url"] = f"http://127.0.0.1:{closed_port()}/v1"
    config["runtime"].update(runtime)
    config["dataset"]["path"] = str(REPO / "configs" / "data" / "local_demo.jsonl")
    path = tmp_path / "local_demo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_real_model_on_the_local_runtime_without_allow_host_exec_fails_before_any_work(tmp_path):
    out = rollout(tmp_path, str(real_model_config(tmp_path)))
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "runtime.allow_host_exec" in out.stderr, out.stderr
    assert not (tmp_path / "local_demo").exists()


def test_an_unreachable_model_endpoint_fails_before_any_work(tmp_path):
    out = rollout(tmp_path, str(real_model_config(tmp_path, allow_host_exec=True)))
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "model.base_url" in out.stderr, out.stderr
    assert not (tmp_path / "local_demo").exists()
    # serve: {app: endpoint} names its own URL: that one is checked, and named
    port = closed_port()
    out = rollout(tmp_path, str(real_model_config(tmp_path, allow_host_exec=True)), "serve.app=endpoint",
                  f"serve.base_url=http://127.0.0.1:{port}/v1")
    assert out.returncode == 2, out.stderr
    assert f"serve.base_url: cannot reach http://127.0.0.1:{port}/v1" in out.stderr, out.stderr
    assert not (tmp_path / "local_demo").exists()


def test_a_bad_scripted_serve_section_fails_before_any_work(tmp_path):
    for override, field in [("serve.faults.fail_frist_n=3", "serve.faults.fail_frist_n"),
                            ("serve.faults.status=teapot", "serve.faults.status"),
                            ("serve.policy=nope", "serve.policy")]:
        out = rollout(tmp_path, str(DEMO), override)
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and field in out.stderr, out.stderr
        assert not (tmp_path / "local_demo").exists()


def test_a_config_error_lists_every_problem_one_line_each(tmp_path):
    out = rollout(tmp_path, str(DEMO), "run.samples=0", "run.concurrency=many", "output.trajectoriez=false")
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        "config error: run.samples: Input should be greater than or equal to 1 (got 0)",
        "config error: run.concurrency: Input should be a valid integer, unable to parse string as an integer "
        "(got 'many')",
        "config error: output.trajectoriez: unknown key (did you mean output.trajectories?)"], out.stderr
    assert "more)" not in out.stderr
    assert not (tmp_path / "local_demo").exists()
