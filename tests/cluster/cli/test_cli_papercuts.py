"""The command line's small promises: ``--version``; an override that changes a section's ``type``; help text on
every option of every subcommand; a Hugging Face dataset without the hub fails at once (or uses a cached copy)."""

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.cli import main as cli, version
from cluster.config.run_config import RunConfig
from rollout.config.load import load_config, validate

REPO = Path(__file__).resolve().parents[3]
SWE = REPO / "configs" / "swe_demo.yaml"
DEMO = REPO / "configs" / "local_demo.yaml"
PROXIES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


def rollout(*args, home=None, timeout=180, **env):
    env = {k: v for k, v in os.environ.items() if k.lower() not in PROXIES and not k.startswith("HF_")} | env
    if home is not None:
        env["ROLLOUT_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "cluster", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def pyproject_version() -> str:
    return re.search(r'(?m)^version = "([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)


def test_version_prints_the_package_version_and_exits_0():
    out = rollout("--version")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"rollout-farm {pyproject_version()}\n", "")
    script = Path(sys.executable).parent / "rollout"
    if script.exists():  # the console script says the same
        assert subprocess.run([str(script), "--version"], capture_output=True, text=True).stdout == out.stdout


def test_version_falls_back_to_pyproject_without_package_metadata(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert version.package_version() == pyproject_version()


def swe_local(home, *overrides):
    """The SWE demo on one instance, its scripted model in process (no Ray Serve)."""
    return rollout("run", "--local", str(SWE), "runtime.type=local",
                   "serve={app: scripted, in_process: true, policy: gold}",
                   f"dataset.path={home / 'data' / 'swe_mini.jsonl'}", "dataset.slice=0:1", *overrides, home=home)


def test_picking_local_on_the_swe_demo_drops_the_auto_sections_and_runs(tmp_path):
    out = swe_local(tmp_path)
    assert out.returncode == 0, out.stderr
    assert ("runtime.type=local replaces auto: dropped runtime.docker, runtime.local (not options of local); "
            "carried over runtime.local's timeout") in out.stderr.splitlines()
    stored = json.loads((tmp_path / "swe_demo" / "config.json").read_text())
    assert stored["runtime"] == {"type": "local", "timeout": 120}  # the file's local: section, now the runtime's
    [result] = [json.loads(line) for line in (tmp_path / "swe_demo" / "results.jsonl").read_text().splitlines()]
    assert result["reward"] == 1.0


def test_a_key_set_on_the_command_line_is_not_dropped_with_the_old_type(tmp_path):
    out = swe_local(tmp_path, "runtime.docker.memory=2g", "runtime.timeout=30")
    assert out.returncode == 2
    assert "config error: runtime.docker: unknown key" in out.stderr.splitlines(), out.stderr
    assert not (tmp_path / "swe_demo").exists()


def test_an_agent_type_override_keeps_the_keys_the_new_agent_takes(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(DEMO.read_text().replace("  max_steps: 12\n", "  max_steps: 12\n  max_observation_chars: 500\n"))
    raw = load_config([config], ["agent.type=tool_calling", "agent.system_prompt=Be brief."])
    run = validate(RunConfig, raw)
    assert run.agent == {"type": "tool_calling", "max_steps": 12, "system_prompt": "Be brief."}
    assert capsys.readouterr().err == ("agent.type=tool_calling replaces mini_swe: dropped agent.max_observation_chars "
                                       "(not an option of tool_calling)\n")


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser ``rollout`` reaches, by command (``rollout gym serve``), from each one's ``--help``."""
    found: dict[str, argparse.ArgumentParser] = {}
    shown: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.print_help
    argparse.ArgumentParser.print_help = lambda self, file=None: shown.append(self)
    try:
        def walk(words: list[str]) -> None:
            shown.clear()
            try:
                code = cli.main([*words, "--help"])  # `rollout images` returns argparse's exit code
            except SystemExit as exc:
                code = exc.code
            assert code in (0, None) and len(shown) == 1, words
            parser = found[" ".join(["rollout", *words])] = shown[0]
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    for name in action.choices:
                        walk([*words, name])

        walk([])
    finally:
        argparse.ArgumentParser.print_help = real
    return found


COMMANDS = ["rollout", "rollout run", "rollout status", "rollout repair", "rollout images", "rollout images base",
            "rollout images build", "rollout images prune", "rollout eval", "rollout serve", "rollout models",
            "rollout models tiny", "rollout gym", "rollout gym serve", "rollout gym collect", "rollout gc",
            "rollout fake-server", "rollout report", "rollout metrics", "rollout metrics scrape-config",
            "rollout dev-cluster", "rollout dev-cluster up", "rollout dev-cluster status", "rollout dev-cluster down",
            "rollout export", "rollout check-tasks"]


def test_the_walk_reaches_every_subcommand():
    assert sorted(parsers()) == sorted(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help(command):
    parser = parsers()[command]
    assert [a.option_strings for a in parser._actions if a.option_strings and not a.help] == []


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_plain_text_without_docstring_markup(command):
    """Descriptions and option help come from docstrings, written in reStructuredText: the help shows ``x`` as x."""
    text = parsers()[command].format_help()
    assert "``" not in text, text


def test_a_help_made_from_a_docstring_keeps_its_words():
    text = " ".join(parsers()["rollout serve"].format_help().split())
    assert "rollout serve CONFIG [key=value ...]: deploy a config's serve section on Ray Serve" in text


@pytest.mark.parametrize("module", ["envs.resources.calc_server", "envs.resources.text_game", "envs.swe.mini"])
def test_the_python_m_tools_help_is_plain_text_too(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.startswith("usage: ") and "``" not in out.stdout, out.stdout


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HAS_DATASETS = importlib.util.find_spec("datasets") is not None


def test_a_hub_dataset_without_the_hub_fails_at_once_with_one_clear_line(tmp_path):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    t0 = time.monotonic()
    out = rollout("run", "--local", str(DEMO), "dataset.path=hf://someone/tasks", home=tmp_path,
                  HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"))
    took = time.monotonic() - t0
    assert out.returncode == 2
    [line] = out.stderr.splitlines()
    if HAS_DATASETS:
        assert line == (f"config error: hf://someone/tasks: cannot load 'someone/tasks' (split 'test'): the Hugging "
                        f"Face hub at {endpoint} is unreachable ({endpoint[7:]}: Connection refused); with "
                        "HF_HUB_OFFLINE=1 a cached copy is used")
    else:
        assert "needs the optional `datasets` package: pip install datasets" in line
    assert took < 10, took  # not datasets' retries (about 25 s)
    assert not (tmp_path / "local_demo").exists()


def cache_hub_dataset(home: Path, name: str, rows: Path) -> None:
    """Put ``rows`` in the datasets cache under hub name ``name``, as a download would have (no hub needed)."""
    script = f"""
import datasets, pathlib, shutil
d = datasets.load_dataset("json", data_files={{"test": {str(rows)!r}}}, split="test")
src = pathlib.Path(d.cache_files[0]["filename"]).parent
owner, repo = {name!r}.split("/")
dst = pathlib.Path(datasets.config.HF_DATASETS_CACHE) / f"{{owner}}___{{repo}}" / "default" / "0.0.0" / "cached"
dst.mkdir(parents=True)
shutil.copy(src / "dataset_info.json", dst)
shutil.copy(src / "json-test.arrow", dst / f"{{repo}}-test.arrow")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {"HF_HOME": str(home),
                                                                             "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, timeout=120)


@pytest.mark.skipif(not HAS_DATASETS, reason="the optional datasets package is not installed")
def test_offline_a_cached_hub_dataset_is_used_and_a_missing_one_fails_at_once(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text((REPO / "configs" / "data" / "local_demo.jsonl").read_text().splitlines()[0] + "\n")
    cache_hub_dataset(tmp_path / "hf", "someone/tasks", rows)
    offline = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
               "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}

    out = rollout("run", "--local", str(DEMO), "dataset.path=hf://someone/tasks", "run.samples=1", home=tmp_path,
                  **offline)
    assert out.returncode == 0, out.stderr
    [result] = [json.loads(line) for line in (tmp_path / "local_demo" / "results.jsonl").read_text().splitlines()]
    assert (result["task_id"], result["reward"]) == ("shell-hello", 1.0)

    out = rollout("run", "--local", str(DEMO), "dataset.path=hf://someone/other", "run_id=other", home=tmp_path,
                  **offline)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == ("config error: hf://someone/other: cannot load 'someone/other' (split "
                                           "'test') offline (HF_HUB_OFFLINE is set): no copy in the local cache")
    assert not (tmp_path / "other").exists()


def test_problems_in_several_sections_are_all_listed_at_once(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("model: {type: scripted, policy: echo}\n"
                      "agent: {type: tool_calling, max_stepz: 3}\n"
                      "environment: {type: shell, comand_timeout: 3}\n"
                      "runtime: {type: local, bogus: 1}\n"
                      f"dataset: {{path: {REPO / 'configs' / 'data' / 'local_demo.jsonl'}}}\n")
    out = rollout("run", str(config), "--local", home=tmp_path)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.startswith("config error:")]
    assert lines == ["config error: agent.max_stepz: unknown key (did you mean agent.max_steps?)",
                     "config error: environment.comand_timeout: unknown key (did you mean "
                     "environment.command_timeout?)",
                     "config error: runtime.bogus: unknown key"]  # nothing close to it: no guess
    assert not (tmp_path / "bad").exists()


def test_a_misspelt_auto_runtime_section_is_named_not_dropped(tmp_path):
    out = rollout("run", "--local", str(SWE), "runtime.dokcer.memory=2g", home=tmp_path)
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["config error: runtime.dokcer: unknown key (did you mean runtime.docker?)"]
    assert not (tmp_path / "swe_demo").exists()


def test_run_id_on_the_command_line_names_the_run_beside_the_files_output_dir(tmp_path):
    """local_demo.yaml sets ``output.dir: local_demo``: ``run_id=`` on the command line still gets a run of its own,
    in the same folder; ``output.dir`` on the command line as well wins."""
    slice_ = "dataset.slice=0:1"
    out = rollout("run", "--local", str(DEMO), slice_, "run_id=mine", home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"run directory: {tmp_path / 'mine'}" in out.stderr.splitlines()
    assert json.loads((tmp_path / "mine" / "summary.json").read_text())["run_id"] == "mine"
    assert not (tmp_path / "local_demo").exists()
    out = rollout("run", "--local", str(DEMO), slice_, "run_id=mine2", "output.dir=elsewhere", home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"run directory: {tmp_path / 'elsewhere'}" in out.stderr.splitlines()
    assert not (tmp_path / "mine2").exists()


@pytest.mark.parametrize("flag, value, said", [
    ("--policy", "nosuch", "unknown policy 'nosuch'; choose one of "),
    ("--policy", "nowhere.module:policy", "cannot import 'nowhere.module'"),
    ("--latency", "-1", "seconds, 0 or more, got '-1'"),
    ("--port", "99999", "a port is a number from 0 to 65535"),
    ("--dataset", "no-such-tasks.jsonl", "no such file: no-such-tasks.jsonl"),
])
def test_fake_server_errors_name_the_flag_the_user_typed(flag, value, said):
    port = [] if flag == "--port" else ["--port", "0"]  # should the value pass, nothing is left listening on 8000
    out = rollout("fake-server", *port, flag, value, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines()[-1].startswith(f"rollout fake-server: error: argument {flag}: {said}"), out.stderr
    assert "model.policy" not in out.stderr and "Traceback" not in out.stderr


def test_fake_server_help_lists_every_policy_it_takes_by_name():
    from cluster.names import POLICIES

    out = rollout("fake-server", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())  # argparse wraps the help
    assert {"demo", "echo", "gold"} <= set(POLICIES.names())  # every package's policies: rollout's, envs', agents'
    assert f"one of {', '.join(POLICIES.names())} (default echo)" in text
    wrong = rollout("fake-server", "--policy", "nosuch", "--port", "0")
    assert all(name in wrong.stderr for name in POLICIES.names())  # the error lists the same names
