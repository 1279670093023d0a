"""`rollout run` end to end, in subprocesses: the demo, resume, SIGKILL, config errors."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "local_demo.yaml"
DEMO_ROLLOUTS = 16  # 8 tasks x 2 samples


def rollout(home, *args, timeout=180):
    env = {**os.environ, "ROLLOUT_HOME": str(home)}
    if args[:1] == ("run",):  # these tests are about runs, not the farm: in-process, no Ray start per test
        args = ("run", "--local", *args[1:])
    return subprocess.run([sys.executable, "-m", "cluster", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def lines(run_dir):
    path = run_dir / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_demo_runs_every_agent_and_a_second_run_does_nothing(tmp_path):
    first = rollout(tmp_path, "run", str(DEMO))
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "local_demo"
    assert f"run directory: {run_dir}" in first.stderr
    results = lines(run_dir)
    assert len(results) == DEMO_ROLLOUTS
    assert {(r["task_id"], r["sample_index"]) for r in results} == {
        (t, s) for t in {r["task_id"] for r in results} for s in (0, 1)}
    for r in results:
        assert r["status"] == "completed" and r["exit_reason"] and r["reward"] is not None
    by_reason = Counter(r["exit_reason"] for r in results)
    assert by_reason == {"submitted": 6, "natural_completion": 6, "environment_done": 4}  # all three agents ran
    shell = [r for r in results if r["task_id"].startswith("shell-")]
    assert all(r["reward"] == 1.0 for r in shell)  # graded by the check command in the workspace
    assert all(r["reward"] == 1.0 for r in results if r["task_id"].startswith("tools-"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rollouts"] == {"total": DEMO_ROLLOUTS, "completed": DEMO_ROLLOUTS, "infra_failed": 0}
    assert summary["reward_mean"] > 0.9 and summary["exit_reasons"] == dict(by_reason)
    # the seconds before the first model call, split by part, in summary.json and the table
    startup = summary["startup"]
    assert {"config", "dataset", "first container"} <= set(startup["parts"])
    assert 0 < max(startup["parts"].values()) <= startup["seconds"] < summary["wall_seconds"] + 60
    assert f"start-up        {startup['seconds']:.1f}s to the first model call: config " in first.stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["dataset"]["hash"] and manifest["config_hash"]
    # token data from the HTTP server reached the trajectories
    traj = json.loads((run_dir / results[0]["trajectory_path"]).read_text())
    assert traj["final"] and traj["trajectory"]["steps"][0]["completion_token_ids"]

    second = rollout(tmp_path, "run", str(DEMO))
    assert second.returncode == 0, second.stderr
    assert "already done" in second.stderr
    assert json.loads((run_dir / "summary.json").read_text())["startup"] is None  # no model call: no split
    assert "start-up" not in second.stdout
    assert len(lines(run_dir)) == DEMO_ROLLOUTS


def test_sigkill_half_way_then_resume_gives_exactly_one_line_per_rollout(tmp_path):
    env = {**os.environ, "ROLLOUT_HOME": str(tmp_path)}
    args = [sys.executable, "-m", "cluster", "run", "--local", str(DEMO), "serve.latency=0.3",
            "run.concurrency=2"]
    proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = tmp_path / "local_demo"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(lines(run_dir)) < 4:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    killed_at = len(lines(run_dir))
    assert 4 <= killed_at < DEMO_ROLLOUTS, "the kill should land half way"

    again = rollout(tmp_path, "run", str(DEMO), "serve.latency=0.3", "run.concurrency=4")
    assert again.returncode == 0, again.stderr
    keys = Counter((r["task_id"], r["sample_index"]) for r in lines(run_dir))
    assert len(keys) == DEMO_ROLLOUTS and set(keys.values()) == {1}


def test_the_old_spelling_of_the_scripted_policy_still_runs_and_its_run_directories_resume(tmp_path):
    """``fake_server: {...}`` is read as ``serve: {app: scripted, in_process: true, ...}``, its one spelling now; a
    run directory an older version wrote with it (its config.json spelled so) resumes without a "changed" refusal."""
    old = tmp_path / "old.yaml"
    text = DEMO.read_text().replace("serve:\n  app: scripted         # a scripted policy, played in this process (no "
                                    "Serve deployment)\n  in_process: true\n", "fake_server:\n")
    assert "fake_server:" in text and "in_process" not in text
    old.write_text(text.replace("path: data/", f"path: {REPO / 'configs' / 'data'}/"))
    first = rollout(tmp_path, "run", str(old), "run.samples=1")
    assert first.returncode == 0, first.stderr
    assert "fake_server: read as serve: {app: scripted, in_process: true, ...}" in first.stderr
    run_dir = tmp_path / "local_demo"
    stored = json.loads((run_dir / "config.json").read_text())
    assert stored["serve"]["in_process"] is True and "fake_server" not in stored
    # as an older version wrote it: no serve section, the policy under fake_server
    section = stored.pop("serve")
    stored["serve"] = None
    stored["fake_server"] = {key: section[key] for key in ("policy", "latency", "faults")}
    (run_dir / "config.json").write_text(json.dumps(stored))
    again = rollout(tmp_path, "run", str(DEMO), "run.samples=1")
    assert again.returncode == 0, again.stderr
    assert "changed" not in again.stderr and "already done" in again.stderr
    changed = rollout(tmp_path, "run", str(DEMO), "run.samples=1", "serve.policy=echo")
    assert changed.returncode == 2 and "serve.policy" in changed.stderr  # a real change is still refused


def test_bad_config_exits_2_with_one_line_before_any_work(tmp_path):
    for override, field in [("agent.max_stepz=3", "agent.max_stepz"), ("run.concurrency=many", "run.concurrency"),
                            ("environment.command_timeout=-1", "environment.command_timeout"),
                            ("profiles.tools.agent.type=nope", "profiles.tools.agent.type")]:
        out = rollout(tmp_path, "run", str(DEMO), override)
        assert out.returncode == 2, (override, out.stderr)
        assert out.stderr.count("\n") == 1 and field in out.stderr, out.stderr
    assert not (tmp_path / "local_demo").exists()  # nothing was started or written


def test_bad_dataset_row_names_its_line(tmp_path):
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"task_id": "a", "prompt": "x"}\n{"task_id": "b", "prompt": \n')
    config = tmp_path / "c.yaml"
    config.write_text(DEMO.read_text().replace("data/local_demo.jsonl", str(data)))
    out = rollout(tmp_path, "run", str(config))
    assert out.returncode == 2
    assert "line 2" in out.stderr and out.stderr.count("\n") == 1


def test_changed_config_is_refused_unless_new_run(tmp_path):
    assert rollout(tmp_path, "run", str(DEMO), "dataset.slice=0:1").returncode == 0
    changed = rollout(tmp_path, "run", str(DEMO), "dataset.slice=0:1", "agent.max_steps=5")
    assert changed.returncode == 2 and "agent.max_steps" in changed.stderr
    fresh = rollout(tmp_path, "run", str(DEMO), "dataset.slice=0:1", "agent.max_steps=5", "--new-run")
    assert fresh.returncode == 0, fresh.stderr
    assert list((tmp_path / "local_demo").glob("previous-*/results.jsonl"))


def test_infrastructure_failures_are_retried_then_final_then_retried_on_request(tmp_path):
    base = [str(DEMO), "dataset.slice=3:5", "run.samples=1", "model.max_retries=0"]
    # every rollout's first request gets a 500: attempt 1 is an infrastructure failure, attempt 2 succeeds
    out = rollout(tmp_path / "a", "run", *base, "serve.faults.fail_first_n=1")
    assert out.returncode == 0, out.stderr
    results = lines(tmp_path / "a" / "local_demo")
    assert [(r["attempt"], r["status"], r["exit_reason"]) for r in results if r["task_id"] == "tools-course-topic"] == [
        (1, "infra_failed", "model_error"), (2, "completed", "natural_completion")]
    final = [r for r in results if r["attempt"] == 2]
    assert len(final) == 2 and all(len(r["attempts"]) == 2 and r["reward"] == 1.0 for r in final)
    assert all(0.5 <= r["timings"]["backoff"] <= 1.0 for r in final)  # not at once: the engine gets a breath
    assert all("backoff" not in r["timings"] for r in results if r["attempt"] == 1)
    assert all(r["reward"] is None for r in results if r["status"] == "infra_failed")

    # one attempt only: the failures are final, kept out of the reward mean, and a re-run leaves them
    home = tmp_path / "b"
    out = rollout(home, "run", *base, "run.max_attempts=1", "serve.faults.fail_first_n=5")
    summary = json.loads((home / "local_demo" / "summary.json").read_text())
    assert summary["rollouts"]["infra_failed"] == 2 and summary["reward_mean"] is None
    again = rollout(home, "run", *base, "run.max_attempts=1")
    assert "already done" in again.stderr and len(lines(home / "local_demo")) == 2
    # --retry-infra queues them again, as attempt 2
    retried = rollout(home, "run", *base, "run.max_attempts=1", "--retry-infra")
    assert retried.returncode == 0, retried.stderr
    latest = {r["task_id"]: r for r in lines(home / "local_demo")}
    assert {(r["attempt"], r["status"]) for r in latest.values()} == {(2, "completed")}


def test_fake_server_command_serves_scripted_policies(tmp_path):
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "cluster", "fake-server", "--port", "0", "--policy", "echo"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "hi there"}]}).encode()
        request = urllib.request.Request(f"{url}/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        reply = json.loads(urllib.request.urlopen(request, timeout=30).read())
        assert "hi there" in reply["choices"][0]["message"]["content"]
        assert reply["usage"]["prompt_tokens"] > 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.docker
def test_gc_removes_the_containers_of_a_sigkilled_process(base_image, tmp_path):
    run_id = f"gc-cli-{os.getpid()}"
    code = (
        "import asyncio, sys\n"
        "from envs.runtimes.docker.runtime import DockerRuntime\n"
        "async def main():\n"
        # without the dead-man's switch, which would remove them itself: what gc collects is left on purpose
        f"    cfg = {{'image': {base_image!r}, 'die_with_owner': False}}\n"
        f"    rts = [DockerRuntime(cfg, run_id={run_id!r}, rollout_id=f'r{{i}}') for i in range(5)]\n"
        "    await asyncio.gather(*(r.start() for r in rts))\n"
        "    print('ready', flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    listed = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=rollout-farm.run={run_id}"],
                            capture_output=True, text=True).stdout.split()
    assert len(listed) == 5  # SIGKILL skipped every cleanup
    out = rollout(tmp_path, "gc", "--run", run_id)
    assert out.returncode == 0 and "5 container(s) removed" in out.stdout
    assert subprocess.run(["docker", "ps", "-aq", "--filter", f"label=rollout-farm.run={run_id}"],
                          capture_output=True, text=True).stdout.split() == []


def test_a_ray_run_deploys_its_model_while_the_worker_starts_and_prints_the_split(tmp_path):
    """On Ray the Serve app deploys while the worker actor starts (its URL reaches the worker afterwards); the
    summary splits the seconds before the first model call, and says which parts ran side by side."""
    rows = [json.dumps({"task_id": f"echo-{i}", "prompt": "echo twice"}) + "\n" for i in range(3)]
    (tmp_path / "tasks.jsonl").write_text("".join(rows))
    config = tmp_path / "serve_run.yaml"  # JSON is YAML
    config.write_text(json.dumps({
        "run_id": "serve_run", "dataset": {"path": "tasks.jsonl"}, "run": {"concurrency": 2},
        "serve": {"app": "scripted", "name": "split-test", "route_prefix": "/split", "policy": "bash_echo"},
        "model": {"type": "openai", "model": "scripted-bash"}, "agent": {"type": "mini_swe", "max_steps": 5},
        "environment": {"type": "shell"}, "runtime": {"type": "local"}}))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "cluster", "run", str(config)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**env, "ROLLOUT_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "serve_run" / "summary.json").read_text())
    assert summary["rollouts"] == {"total": 3, "completed": 3, "infra_failed": 0}
    startup = summary["startup"]
    assert {"config", "dataset", "ray", "serve", "workers", "first container"} <= set(startup["parts"])
    assert {"serve", "workers"} <= set(startup["side_by_side"])
    assert startup["seconds"] >= startup["parts"]["ray"] + startup["parts"]["serve"]
    assert "start-up" in done.stdout and "(side by side: " in done.stdout
    assert "Deleting app ['split-test']" in done.stderr  # the app goes with the run
    # the workers' own Serve router lines (long-poll client started, router initialised) stay out of the terminal
    assert not re.search(r"\(NodeWorker[^)]*\)\S*\s+INFO[^\n]* serve ", done.stderr), done.stderr[-3000:]
    assert 1 <= summary["concurrency"]["reached"] <= summary["concurrency"]["asked"] == 2
    assert "concurrency" in done.stdout and "(run.concurrency=2)" in done.stdout


def test_local_plays_a_scripted_serve_app_in_this_process_and_starts_no_ray(tmp_path):
    done = rollout(tmp_path, "run", "configs/swe_demo.yaml", "dataset.slice=0:2", timeout=900)  # with --local
    assert done.returncode == 0, done.stderr[-3000:]
    assert "serve: the scripted policy 'gold' plays in this process" in done.stderr
    assert "Ray instance" not in done.stderr and "ray: " not in done.stderr  # no cluster started or joined
    run_dir = tmp_path / "swe_demo"
    assert json.loads((run_dir / "summary.json").read_text())["swe"]["resolved_instances"] == 2
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["serve"]["app"], config["serve"]["policy"]) == ("scripted", "gold") and "fake_server" not in config
    bad = rollout(tmp_path, "run", "configs/swe_demo.yaml", "serve.policy=no_such_policy", "run_id=bad")
    assert bad.returncode == 2 and "serve.policy: unknown policy 'no_such_policy'" in bad.stderr  # as written
