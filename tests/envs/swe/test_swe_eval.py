"""Grading a predictions file against the bundled mini benchmark (local workspaces, and docker for two
instances); predictions in every form; the eval command; the runtime that prepares a repository at start."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.runtimes.local import LocalRuntime
from envs.runtimes.prepared import PreparedRepoRuntime
from envs.swe.evaluate import evaluate
from envs.swe.mini import build
from envs.swe.reports.harness import instance_log_dir
from rollout.errors import ConfigError, ContainerStartError

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def mini(tmp_path_factory):
    """The mini benchmark built once: (dataset path, rows by instance id)."""
    path = build(tmp_path_factory.mktemp("swe_mini_eval"))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return path, {r["instance_id"]: r for r in rows}


def preds_of(rows, patch_of, model="gold"):
    return [{"instance_id": i, "model_name_or_path": model, "model_patch": patch_of(r)} for i, r in rows.items()]


def write_preds(path: Path, preds: list[dict], form: str) -> Path:
    if form == "dict":
        path.write_text(json.dumps({p["instance_id"]: {k: v for k, v in p.items() if k != "instance_id"}
                                    for p in preds}))
    elif form == "list":
        path.write_text(json.dumps(preds, indent=1))
    else:
        path.write_text("".join(json.dumps(p) + "\n" for p in preds))
    return path


def run_eval(dataset, preds_path, out, **kwargs):
    lines = []
    kwargs.setdefault("runtime", "local")
    summary = asyncio.run(evaluate(dataset, preds_path, run_id=kwargs.pop("run_id", "ev"), out_root=out,
                                   progress=lines.append, **kwargs))
    return summary, lines


def test_gold_predictions_resolve_every_instance(mini, tmp_path):
    dataset, rows = mini
    preds = write_preds(tmp_path / "gold.json", preds_of(rows, lambda r: r["patch"]), "dict")
    summary, lines = run_eval(dataset, preds, tmp_path / "out", workers=4)
    assert summary["resolved_ids"] == sorted(rows), lines
    assert summary["total_instances"] == summary["completed_instances"] == len(rows) >= 10
    assert summary["error_ids"] == [] and summary["unresolved_ids"] == []
    assert json.loads((tmp_path / "out" / "gold.ev.json").read_text()) == summary
    for ident in rows:
        where = instance_log_dir(tmp_path / "out", "ev", "gold", ident)
        assert json.loads((where / "report.json").read_text())[ident]["resolved"] is True
        assert (where / "patch.diff").read_text() == rows[ident]["patch"]
        assert "PASSED" in (where / "test_output.txt").read_text()
    assert sum(": resolved (" in line for line in lines) == len(rows)


def test_empty_predictions_resolve_none(mini, tmp_path):
    dataset, rows = mini
    preds = write_preds(tmp_path / "empty.jsonl", preds_of(rows, lambda r: ""), "jsonl")
    summary, lines = run_eval(dataset, preds, tmp_path / "out")
    assert summary["resolved_instances"] == summary["completed_instances"] == 0
    assert summary["empty_patch_ids"] == sorted(rows)
    assert not (tmp_path / "out" / "logs").exists()  # not graded, as the harness skips them
    assert len([line for line in lines if "empty patch" in line]) == len(rows)


def test_every_outcome_lands_in_its_category(mini, tmp_path):
    """Gold resolves, a patch touching only a comment is unresolved, garbage does not apply (an error with
    no report.json), an empty patch is empty, and an instance without a prediction is incomplete."""
    dataset, rows = mini
    ids = sorted(rows)[:4]
    harmless = rows[ids[1]]["patch"].split("\n@@")[0]  # the file header only: not a patch git can apply
    preds = [
        {"instance_id": ids[0], "model_patch": rows[ids[0]]["patch"]},
        {"instance_id": ids[1], "model_patch": harmless + "\n@@ -1 +1 @@\n-no such line\n+x\n"},
        {"instance_id": ids[2], "model_patch": None},
        {"instance_id": ids[3], "model_patch": _comment_patch(rows[ids[3]])},
    ]
    path = write_preds(tmp_path / "mixed.json", preds, "list")
    summary, _ = run_eval(dataset, path, tmp_path / "out", model_name="org/model")
    assert summary["resolved_ids"] == [ids[0]] and summary["unresolved_ids"] == [ids[3]]
    assert summary["error_ids"] == [ids[1]] and summary["empty_patch_ids"] == [ids[2]]
    assert summary["incomplete_ids"] == sorted(rows)[4:]
    failed = instance_log_dir(tmp_path / "out", "ev", "org/model", ids[1])
    assert failed.parent.name == "org__model" and not (failed / "report.json").exists()
    assert "did not apply" in (failed / "run_instance.log").read_text()
    assert (tmp_path / "out" / "org__model.ev.json").is_file()


def _comment_patch(row) -> str:
    """A patch that applies (a comment after the gold patch's first context line) but fixes nothing."""
    lines = row["patch"].splitlines()
    head = [line for line in lines if line.startswith(("diff --git", "--- ", "+++ "))][:3]
    hunk = next(i for i, line in enumerate(lines) if line.startswith("@@"))
    start = int(lines[hunk].split()[1].lstrip("-").split(",")[0])
    context = lines[hunk + 1]
    assert context.startswith(" "), "the gold patch's first hunk starts with context"
    return "\n".join(head + [f"@@ -{start},1 +{start},2 @@", context, "+# looked here"]) + "\n"


@pytest.mark.parametrize("form", ["dict", "list", "jsonl"])
def test_predictions_in_every_form_are_graded(mini, tmp_path, form):
    dataset, rows = mini
    chosen = dict(sorted(rows.items())[:2])
    path = write_preds(tmp_path / f"preds.{'jsonl' if form == 'jsonl' else 'json'}",
                       preds_of(chosen, lambda r: r["patch"], model="m"), form)
    summary, _ = run_eval(dataset, path, tmp_path / "out", run_id=form)
    assert summary["submitted_ids"] == summary["resolved_ids"] == sorted(chosen)
    assert len(summary["incomplete_ids"]) == len(rows) - 2


def test_bad_input_is_a_config_error_before_grading(mini, tmp_path):
    dataset, rows = mini
    unknown = write_preds(tmp_path / "u.json", [{"instance_id": "nope__nope-1", "model_patch": "x"}], "list")
    with pytest.raises(ConfigError, match="nope__nope-1"):
        run_eval(dataset, unknown, tmp_path / "out")
    ident, row = next(iter(rows.items()))
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({k: v for k, v in row.items() if k != "repo_path"}) + "\n")
    gold = write_preds(tmp_path / "g.json", [{"instance_id": ident, "model_patch": row["patch"]}], "list")
    with pytest.raises(ConfigError, match="repo_path"):
        run_eval(bare, gold, tmp_path / "out")
    with pytest.raises(ConfigError, match="runtime"):
        run_eval(dataset, gold, tmp_path / "out", runtime="vm")
    for names in ({"run_id": ".."}, {"run_id": "a/b"}, {"model_name": ".."}):  # each names a directory of the reports
        with pytest.raises(ConfigError, match="cannot name a directory"):
            run_eval(dataset, gold, tmp_path / "out", **names)
    climbing = write_preds(tmp_path / "c.json", [{"instance_id": ident, "model_patch": row["patch"],
                                                 "model_name_or_path": ".."}], "list")
    with pytest.raises(ConfigError, match="the model name"):
        run_eval(dataset, climbing, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.docker
def test_docker_grading_of_two_instances(mini, tmp_path, base_image):
    dataset, rows = mini
    ids = sorted(rows)[:2]
    preds = [{"instance_id": ids[0], "model_patch": rows[ids[0]]["patch"]},
             {"instance_id": ids[1], "model_patch": _comment_patch(rows[ids[1]])}]
    path = write_preds(tmp_path / "p.json", preds, "list")
    summary, lines = run_eval(dataset, path, tmp_path / "out", runtime="docker", run_id="test-swe-eval",
                              eval_timeout=300)
    assert summary["resolved_ids"] == [ids[0]] and summary["unresolved_ids"] == [ids[1]], lines
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=rollout-farm.run=test-swe-eval"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert left == []


def run_cli(*args, home: Path):
    code = "from cluster.cli.eval import main; raise SystemExit(main(__import__('sys').argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], check=False, capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "ROLLOUT_HOME": str(home)}, timeout=240)


def test_eval_command(mini, tmp_path):
    dataset, rows = mini
    chosen = dict(sorted(rows.items())[:2])
    preds = write_preds(tmp_path / "mypreds.jsonl", preds_of(chosen, lambda r: r["patch"]), "jsonl")
    done = run_cli("--dataset", str(dataset), "--predictions", str(preds), "--runtime", "local", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"resolved 2/{len(rows)}" in done.stdout
    report = tmp_path / "mypreds" / "gold.mypreds.json"  # run id: the predictions' stem, under ROLLOUT_HOME
    assert json.loads(report.read_text())["resolved_ids"] == sorted(chosen)

    bad = run_cli("--dataset", str(tmp_path / "missing.jsonl"), "--predictions", str(preds), home=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("config error:") and len(bad.stderr.splitlines()) == 1
    assert run_cli("--dataset", str(dataset), home=tmp_path).returncode == 2  # --predictions is required


# ---- PreparedRepoRuntime ----------------------------------------------------------------------


def git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def history(tmp_path):
    """A repository with a base commit, then a fix on the same branch and a tag: (path, base, fix)."""
    repo = tmp_path / "src"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "trunk")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "a.py").write_text("x = 2  # the fix\n")
    git(repo, "commit", "-qam", "fix")
    git(repo, "tag", "v2")
    return repo, base, git(repo, "rev-parse", "HEAD")


def inner_runtime(kind, request, tmp_path):
    if kind == "local":
        return LocalRuntime({"root": str(tmp_path / "ws")}, trusted_model=True)
    request.getfixturevalue("base_image")
    from envs.runtimes.docker.runtime import DockerRuntime

    return DockerRuntime({"image": "rollout-farm/base:bookworm", "workdir": "/work"}, run_id="test-swe-eval",
                         rollout_id="prepared")


@pytest.mark.parametrize("kind", ["local", pytest.param("docker", marks=pytest.mark.docker)])
@pytest.mark.parametrize("source", ["directory", "bundle"])
def test_prepared_repo_is_at_base_with_no_later_history(history, tmp_path, request, kind, source):
    repo, base, fix = history
    path = repo
    if source == "bundle":
        path = tmp_path / "src.bundle"
        git(repo, "bundle", "create", str(path), "--all")

    async def scenario():
        runtime = PreparedRepoRuntime(inner_runtime(kind, request, tmp_path), str(path), base[:10])
        try:
            await runtime.start()
            assert runtime.workdir == runtime.inner.workdir is not None
            head = await runtime.exec("git rev-parse HEAD; git branch --show-current; cat a.py; git tag; "
                                      "git log --all --format=%s; git remote", cwd="testbed")
            seen = await runtime.exec(f"git cat-file -e {fix}", cwd="testbed")
            commit = await runtime.exec("echo y > b.py && git add b.py && git commit -qm mine && echo ok",
                                        cwd="testbed")
            return head.output.split("\n"), seen.returncode, commit.output
        finally:
            await runtime.close()

    lines, fix_present, committed = asyncio.run(scenario())
    assert lines[:5] == [base, "trunk", "x = 1", "base", ""]  # no tag, one commit, no remote
    assert fix_present != 0 and committed.strip() == "ok"
    assert not (tmp_path / "ws").exists() or not list((tmp_path / "ws").iterdir())


def test_prepared_repo_with_a_commit_it_lacks_fails_to_start(history, tmp_path):
    repo, _, _ = history

    async def scenario(path, commit):
        runtime = PreparedRepoRuntime(LocalRuntime({"root": str(tmp_path / "ws")}, trusted_model=True), path, commit)
        try:
            await runtime.start()
        finally:
            await runtime.close()

    with pytest.raises(ContainerStartError, match="is not in") as caught:
        asyncio.run(scenario(str(repo), "0" * 40))
    assert caught.value.retryable is False
    with pytest.raises(ContainerStartError, match="does not exist"):
        asyncio.run(scenario(str(tmp_path / "nowhere"), "HEAD"))
