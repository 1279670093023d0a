"""Build the grading conformance corpus: real upstream bug-fix commits as SWE-bench rows, from local mirrors.

    .venv/bin/python tests/corpus/build_corpus.py --mirrors DIR [--only NAME ...] [--base IMAGE]

``spec.json`` lists projects (upstream repository, runner, layout, ``test_cmd`` with ``{tests}`` for the test
files the fix's tests touch, optional ``install_cmd``; ``log_parser`` for a runner whose output the pytest parser
does not read, which makes its rows 5.x-shaped) and instances (a project and its fix commit). For each
instance the fix's parent is the base, the fix's changes to test files (``envs.swe.mini``'s rule) are
``test_patch`` and the rest is ``patch`` (gold). Each project's bases go into one bundle,
``data/repos/<project>.bundle``: per instance a branch holding one commit whose tree is the upstream base tree
(LICENSE included), made with a fixed identity and date, so ``base_commit`` is the same on every machine and
no later upstream history is shipped. The row records the upstream commit it came from (``upstream_commit``).

FAIL_TO_PASS / PASS_TO_PASS are found by running ``test_cmd`` bare (no grader) in a fresh container of the base
image, read by the harness's parser as ``envs.swe.mini`` reads them (a ``log_parser`` project's: by that parser):
base + test patch, then + gold. A ``wrong`` patch is made per instance: the first half of the gold patch's hunks
when it has two or more, that half leaves a FAIL_TO_PASS test failing and the suite still runs (it may break a
module pytest itself imports), else a comment added where the gold patch changes code. Needs docker and the
mirrors (a directory of bare clones, ``<owner>+<name>/repo`` each: ``git clone --mirror URL
DIR/<owner>+<name>/repo``); CI reads only what this writes into
``data/``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envs.swe.logs.parsers import PARSERS  # noqa: E402
from envs.swe.logs.pytest_log import END_MARKER, PASSING, START_MARKER, parse_log_pytest  # noqa: E402
from envs.swe.mini import _GIT_ENV, _env, _is_test_file, _write_atomic  # noqa: E402

HERE = Path(__file__).resolve().parent
SPEC = HERE / "spec.json"
DATA = HERE / "data"
DATASET = "corpus.jsonl"
WRONG = "wrong_patches.json"
BASE_IMAGE = "rollout-farm/base:bookworm"
README_START, README_END = "<!-- table: written by build_corpus.py -->", "<!-- end of table -->"
RUN_TIMEOUT = 600
_SUMMARY = re.compile(r"^=+ .*\b(passed|failed|error|errors)\b.* in [0-9.]+s|^Ran \d+ tests? in [0-9.]+s", re.M)
"""A run that finished: pytest's summary line, or unittest's."""
V5_IMAGE = "rollout-farm/corpus:{name}"
"""A 5.x row's ``image``: a name only, as the image is built from ``repo_path`` (the test grades with that build)."""
_TEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")


class CorpusError(Exception):
    """An instance that cannot be made a row (the message says why)."""


def git(git_dir: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["git", "--git-dir", str(git_dir), *args], input=stdin, capture_output=True, text=True,
                          env=_env(_GIT_ENV), timeout=300)
    if done.returncode != 0:
        raise CorpusError(f"git {' '.join(args[:3])}: {done.stderr.strip()[-800:]}")
    return done.stdout


def mirror_of(mirrors: Path, repo: str) -> Path:
    return mirrors / repo.replace("/", "+") / "repo"


def split_fix(mirror: Path, fix: str) -> tuple[str, str, str, list[str], list[str]]:
    """(base sha, gold patch, test patch, test files to run, changed Python source files) of the fix ``fix``."""
    base = git(mirror, "rev-parse", f"{fix}^").strip()
    changed = git(mirror, "diff", "--name-only", "--no-renames", base, fix).split()
    tests = [f for f in changed if _is_test_file(f)]
    source = [f for f in changed if not _is_test_file(f)]
    if not tests or not source:
        raise CorpusError(f"{fix}: needs both test and non-test changes (tests {tests}, source {source})")
    gold = git(mirror, "diff", "--no-renames", "--full-index", base, fix, "--", *source)
    test_patch = git(mirror, "diff", "--no-renames", "--full-index", base, fix, "--", *tests)
    if "GIT binary patch" in gold + test_patch or "Binary files" in gold + test_patch:
        raise CorpusError(f"{fix}: binary changes")
    present = set(git(mirror, "ls-tree", "-r", "--name-only", fix, "--", *tests).split())
    return (base, gold, test_patch, sorted(f for f in tests if f in present and _TEST_FILE.search(f)),
            sorted(f for f in source if f.endswith(".py")))


def hunks(patch: str) -> list[tuple[str, list[str]]]:
    """Each hunk of a unified diff with its file header: (header, hunk lines)."""
    out, header, current = [], "", None
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git "):
            header, current = line, None
        elif current is None and not line.startswith("@@"):
            header += line
        elif line.startswith("@@"):
            current = [line]
            out.append((header, current))
        else:
            current.append(line)
    return out


def join_hunks(parts: list[tuple[str, list[str]]]) -> str:
    text, last = "", None
    for header, lines in parts:
        if header != last:
            text += header
            last = header
        text += "".join(lines)
    return text


def _path(header: str) -> str:
    return header.splitlines()[0].split(" b/", 1)[-1].strip()


def first_half(gold: str) -> str | None:
    """The first half of the gold patch's hunks in Python files, or None with fewer than two such hunks."""
    parts = [h for h in hunks(gold) if _path(h[0]).endswith(".py")]
    if len(parts) < 2:
        return None
    return join_hunks(parts[: len(parts) // 2])


def comment_only(mirror: Path, base: str, gold: str) -> str:
    """A patch that adds a comment line where the gold patch first changes a Python file: it touches the code
    the fix touches and changes no behaviour."""
    header, lines = next(h for h in hunks(gold) if _path(h[0]).endswith(".py"))
    path = _path(header)
    start = int(re.match(r"@@ -(\d+)", lines[0]).group(1))
    offset = next(i for i, line in enumerate(lines[1:]) if line[:1] in "+-")
    at = start + offset - 1  # 0-based index of the first changed line in the base file
    text = git(mirror, "show", f"{base}:{path}").splitlines(keepends=True)
    indent = re.match(r"[ \t]*", text[at] if at < len(text) else "").group(0)
    added = f"{indent}# Edge case: handled by the code below.\n"
    lo, hi = max(0, at - 3), min(len(text), at + 3)
    body = [" " + line for line in text[lo:at]] + ["+" + added] + [" " + line for line in text[at:hi]]
    for i, line in enumerate(body):
        if not line.endswith("\n"):
            body[i] = line + "\n\\ No newline at end of file\n"
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -{lo + 1},{hi - lo} +{lo + 1},{hi - lo + 1} @@\n" + "".join(body))


def make_bundle(mirror: Path, project: str, instances: list[dict[str, Any]], repo: str, out: Path) -> dict[str, str]:
    """One bundle per project: a branch per instance, one commit each holding the upstream base tree."""
    with tempfile.TemporaryDirectory(prefix=f"corpus-{project}-") as tmp:
        work = Path(tmp, "repo.git")
        subprocess.run(["git", "init", "-q", "--bare", str(work)], check=True, env=_env(_GIT_ENV))
        Path(work, "objects", "info", "alternates").write_text(str(mirror / "objects") + "\n")
        commits = {}
        for inst in instances:
            base = git(mirror, "rev-parse", f"{inst['commit']}^").strip()
            tree = git(mirror, "rev-parse", f"{base}^{{tree}}").strip()
            message = f"{repo}@{base}: base of {inst['name']}\n"
            commit = git(work, "commit-tree", tree, "-m", message).strip()
            git(work, "update-ref", f"refs/heads/{inst['name']}", commit)
            commits[inst["name"]] = commit
        git(work, "symbolic-ref", "HEAD", f"refs/heads/{instances[0]['name']}")
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        git(work, "bundle", "create", "-q", str(partial), "--branches", "HEAD")
        os.replace(partial, out)
    return commits


def run_tests(bundle: Path, branch: str, patches: list[str], test_cmd: str, install_cmd: str | None,
              image: str, parse=parse_log_pytest) -> tuple[dict[str, str], str]:
    """Statuses (harness parser) and log of ``test_cmd`` in a fresh container: clone, patches, install, tests."""
    with tempfile.TemporaryDirectory(prefix="corpus-run-") as tmp:
        os.chmod(tmp, 0o755)
        steps = [f"git clone -q -b {shlex.quote(branch)} /in/repo.bundle /testbed", "cd /testbed"]
        for n, patch in enumerate(patches):
            Path(tmp, f"{n}.patch").write_text(patch)
            steps.append(f"git apply /in/{n}.patch")
        if install_cmd:
            steps.append(install_cmd)
        shutil.copyfile(bundle, Path(tmp, "repo.bundle"))
        # The log goes to a file: the docker CLI can lose the end of a large output when the container exits.
        script = " && ".join(f"( {s} )" if s != "cd /testbed" else s for s in steps)
        script = f"{{ {script} && {{ {test_cmd} ; }} ; }} > /in/log.txt 2>&1\n"
        # No rollout-farm label: test sessions reap labelled containers whose owner they do not know.
        argv = ["docker", "run", "--rm", "--network", "none", "-v", f"{tmp}:/in", image, "bash", "-c", script]
        subprocess.run(argv, capture_output=True, timeout=RUN_TIMEOUT)
        log_file = Path(tmp, "log.txt")
        log = log_file.read_bytes().decode("utf-8", errors="replace") if log_file.exists() else ""
    return parse(log), log


def build_instance(project: dict[str, Any], inst: dict[str, Any], mirror: Path, bundle: Path, commit: str,
                   image: str) -> tuple[dict[str, Any], str]:
    base, gold, test_patch, test_files, sources = split_fix(mirror, inst["commit"])
    test_files = inst.get("tests", test_files)  # when the fix's tests are data files another test module reads
    if not test_files:
        raise CorpusError(f"{inst['name']}: no test_*.py file among the fix's test changes")
    test_cmd = project["test_cmd"].format(tests=" ".join(test_files), sources=" ".join(sources))
    install, parse = project.get("install_cmd"), PARSERS.get(project.get("log_parser"), parse_log_pytest)
    before, log_before = run_tests(bundle, inst["name"], [test_patch], test_cmd, install, image, parse)
    after, log_after = run_tests(bundle, inst["name"], [test_patch, gold], test_cmd, install, image, parse)
    for label, log in (("base + tests", log_before), ("gold", log_after)):
        if not _SUMMARY.search(log):
            raise CorpusError(f"{inst['name']}: the run on {label} did not finish:\n{log[-2500:]}")
    ok_before = {t for t, s in before.items() if s in PASSING}
    ok_after = {t for t, s in after.items() if s in PASSING}
    f2p, p2p, broken = sorted(ok_after - ok_before), sorted(ok_before & ok_after), sorted(ok_before - ok_after)
    if broken or not f2p:
        why = f"gold breaks {broken}" if broken else "no test fails before gold and passes after"
        raise CorpusError(f"{inst['name']}: {why}\n{log_after[-2500:]}")
    wrong, kind = first_half(gold), "first half of the gold hunks"
    if wrong:  # kept only when it fixes less than gold and the suite still runs (pytest itself may import it)
        statuses, log = run_tests(bundle, inst["name"], [test_patch, wrong], test_cmd, install, image, parse)
        if all(statuses.get(t) in PASSING for t in f2p) or not _SUMMARY.search(log):
            wrong = None
    if not wrong:
        wrong, kind = comment_only(mirror, base, gold), "a comment where the fix changes code"
    owner, name = project["repo"].split("/")
    row = {
        "instance_id": f"{owner}__{name}-corpus-{inst['name']}",
        "repo": project["repo"],
        "base_commit": commit,
        "upstream_commit": base,
        "upstream_fix": git(mirror, "rev-parse", inst["commit"]).strip(),
        "problem_statement": git(mirror, "log", "-1", "--format=%B", inst["commit"]).strip(),
        "version": project.get("version", "corpus"),
        "patch": gold,
        "test_patch": test_patch,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "repo_path": f"repos/{inst['project']}.bundle",
        "test_cmd": test_cmd,
    }
    if install:
        row["install_cmd"] = install
    if project.get("log_parser"):  # 5.x-shaped: the script applies the test patch and runs the runner
        row.pop("test_cmd")
        old = git(mirror, "ls-tree", "-r", "--name-only", base, "--", *diff_files(test_patch)).split()
        row.update(image=V5_IMAGE.format(name=inst["name"]), log_parser=project["log_parser"],
                   eval_type="pass_and_fail", eval_script=eval_script(commit, test_patch, old, test_cmd))
    return row, f"{kind}\n{wrong}"


def diff_files(patch: str) -> list[str]:
    return [line.split(" b/", 1)[1] for line in patch.splitlines() if line.startswith("diff --git ")]


def eval_script(base: str, test_patch: str, old_tests: list[str], test_cmd: str) -> str:
    """An eval script of SWE-bench 5.x's shape: the test files reset to the base, the test patch applied, the runner
    between the test output markers, the test files reset again."""
    reset = f"git checkout {base} {' '.join(old_tests)}" if old_tests else ":"
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail", "cd /testbed", "git config --global --add safe.directory /testbed",
        "git status", f"git -c core.fileMode=false diff {base}", reset,
        f"git apply -v - <<'EOF_114329324912'\n{test_patch.rstrip(chr(10))}\nEOF_114329324912",
        f": '{START_MARKER}'", test_cmd, f": '{END_MARKER}'", reset]) + "\n"


def build(mirrors: Path, only: list[str] | None, image: str, jobs: int) -> tuple[list[dict], list[str]]:
    spec = json.loads(SPEC.read_text())
    projects, wanted = spec["projects"], spec["instances"]
    old_rows = _read_rows(DATA / DATASET)
    old_wrong = _read_json(DATA / WRONG)
    rows: dict[str, dict] = {}
    wrong: dict[str, str] = {}
    failures: list[str] = []
    by_project: dict[str, list[dict]] = {}
    for inst in wanted:
        by_project.setdefault(inst["project"], []).append(inst)
    todo = []
    for project, instances in by_project.items():
        selected = [i for i in instances if not only or i["name"] in only or project in only]
        bundle = DATA / "repos" / f"{project}.bundle"
        if selected:
            commits = make_bundle(mirror_of(mirrors, projects[project]["repo"]), project, instances,
                                  projects[project]["repo"], bundle)
        for inst in instances:
            if inst in selected:
                todo.append((project, inst, bundle, commits[inst["name"]]))
            elif inst["name"] in old_rows:
                rows[inst["name"]] = old_rows[inst["name"]]
                wrong[rows[inst["name"]]["instance_id"]] = old_wrong.get(rows[inst["name"]]["instance_id"], "")

    def one(item):
        project, inst, bundle, commit = item
        inst = {**inst, "project": project}
        return inst["name"], build_instance(projects[project], inst, mirror_of(mirrors, projects[project]["repo"]),
                                            bundle, commit, image)

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(one, item): item[1]["name"] for item in todo}
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            try:
                _, (row, wrong_patch) = future.result()
            except (CorpusError, subprocess.TimeoutExpired) as exc:
                failures.append(f"{name}: {exc}")
                print(f"FAILED {name}: {str(exc)[:3000]}", flush=True)
                continue
            rows[name], wrong[row["instance_id"]] = row, wrong_patch
            print(f"ok {name}: {len(row['FAIL_TO_PASS'])} F2P, {len(row['PASS_TO_PASS'])} P2P; wrong: "
                  f"{wrong_patch.splitlines()[0]}", flush=True)
    order = [i["name"] for i in wanted if i["name"] in rows]
    _write_atomic(DATA / DATASET, "".join(json.dumps(rows[n], ensure_ascii=False) + "\n" for n in order))
    _write_atomic(DATA / WRONG, json.dumps({rows[n]["instance_id"]: wrong[rows[n]["instance_id"]] for n in order},
                                           indent=1, ensure_ascii=False) + "\n")
    return [rows[n] for n in order], failures


def write_readme(rows: list[dict], spec: dict) -> None:
    """The README's table (project, runner, layout, kinds, instances), between its table markers."""
    counts: dict[str, list[str]] = {}
    for row in rows:
        counts.setdefault(row["repo"], []).append(row["instance_id"].split("-corpus-", 1)[1])
    lines = ["| project | runner | layout | kinds | instances |", "|---|---|---|---|---|"]
    for project in spec["projects"].values():
        names = counts.get(project["repo"], [])
        if names:
            lines.append(f"| {project['repo']} | {project['runner']} | {project['layout']} | "
                         f"{', '.join(project['kinds'])} | {len(names)}: {', '.join(names)} |")
    lines.append(f"| **total** | | | | **{len(rows)} instances, {len(counts)} projects** |")
    readme = HERE / "README.md"
    text = readme.read_text()
    head, _, rest = text.partition(README_START)
    _, _, tail = rest.partition(README_END)
    _write_atomic(readme, head + README_START + "\n" + "\n".join(lines) + "\n" + README_END + tail)


def rebundle(mirrors: Path) -> None:
    """Remake every project's bundle from the spec (after instances were dropped), checking that each kept row's
    ``base_commit`` is what its bundle now holds; no test runs."""
    spec, rows = json.loads(SPEC.read_text()), _read_rows(DATA / DATASET)
    by_project: dict[str, list[dict]] = {}
    for inst in spec["instances"]:
        by_project.setdefault(inst["project"], []).append(inst)
    for project, instances in by_project.items():
        repo = spec["projects"][project]["repo"]
        commits = make_bundle(mirror_of(mirrors, repo), project, instances, repo, DATA / "repos" / f"{project}.bundle")
        for name, commit in commits.items():
            if name in rows and rows[name]["base_commit"] != commit:
                raise CorpusError(f"{name}: the bundle's base {commit} is not the row's {rows[name]['base_commit']}")


def _read_rows(path: Path) -> dict[str, dict]:
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return {}
    return {r["instance_id"].split("-corpus-", 1)[1]: r for r in rows}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, required=True, help="a directory of <owner>+<name>/repo bare clones")
    parser.add_argument("--only", nargs="+", help="instance or project names (others keep their rows)")
    parser.add_argument("--base", default=BASE_IMAGE, help="image the tests run in")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rebundle", action="store_true", help="only remake the bundles (no test runs)")
    args = parser.parse_args(argv)
    if args.rebundle:
        rebundle(args.mirrors)
        return 0
    rows, failures = build(args.mirrors, args.only, args.base, args.jobs)
    write_readme(rows, json.loads(SPEC.read_text()))
    print(f"{len(rows)} instances over {len({r['repo'] for r in rows})} projects; {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
