"""The bundled mini SWE benchmark: small repos in configs/swe_mini built into git bundles and a SWE-bench JSONL.

Each ``configs/swe_mini/<name>/`` holds ``repo/`` (the tree at base), ``gold.patch`` (the fix, no test
files), ``test.patch`` (tests only) and ``instance.json`` (``instance_id, repo, problem_statement,
version, test_cmd`` and any further SWE-bench fields, copied through). ``build`` commits each tree with
a fixed identity and date (so ``base_commit`` is the same on every machine), writes
``<out>/repos/<name>.bundle``, and finds FAIL_TO_PASS / PASS_TO_PASS by running ``test_cmd`` on this
host: once on base + test.patch, once more with gold.patch on top. Statuses are read the way the
SWE-bench harness reads them (``envs.swe.logs.pytest_log.parse_log_pytest``), so ids with a space are cut at it.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from envs.swe.logs.pytest_log import PASSING, parse_log_pytest, parse_test_statuses
from rollout.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parents[2] / "configs" / "swe_mini"
DATASET = "swe_mini.jsonl"
STAMP = "swe_mini.stamp.json"
BUILD_VERSION = 1
"""Part of every input hash: bump it when the output for unchanged inputs changes."""
TEST_TIMEOUT = 300.0
_IGNORED = ("__pycache__", ".pytest_cache", "*.pyc")
_REQUIRED = ("instance_id", "repo", "problem_statement", "version", "test_cmd")
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "swe-mini", "GIT_AUTHOR_EMAIL": "swe-mini@example.invalid",
    "GIT_COMMITTER_NAME": "swe-mini", "GIT_COMMITTER_EMAIL": "swe-mini@example.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
    # No user or system config: hooks, templates or autocrlf there would change the commit.
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C",
}


def instance_names(data_dir: str | Path = DATA_DIR) -> list[str]:
    """The instances in ``data_dir``: every subdirectory with an ``instance.json``, sorted."""
    return sorted(p.parent.name for p in Path(data_dir).glob("*/instance.json"))


def build(out_dir: str | Path, names: list[str] | None = None, data_dir: str | Path = DATA_DIR) -> Path:
    """Build (or reuse) the bundles and ``<out_dir>/swe_mini.jsonl``; returns the JSONL path.

    An instance whose inputs hash like the last build's is reused as is. Any broken instance (a
    patch that does not apply, test files in the gold patch, no FAIL_TO_PASS test, a test the gold
    patch breaks) raises ``ConfigError`` naming it; its bundle and the dataset file are then not written.
    """
    out, data = Path(out_dir), Path(data_dir)
    known = instance_names(data)
    names = known if names is None else list(names)
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise ConfigError(f"unknown instances {unknown}; known: {', '.join(known)}" if unknown else "no instances",
                          str(data))
    hashes = {name: _input_hash(data / name) for name in names}
    stamp, old_rows = _load_stamp(out), _load_rows(out / DATASET)
    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        row = old_rows.get(name)
        if row and stamp.get(name) == hashes[name] and (out / "repos" / f"{name}.bundle").is_file():
            rows[name] = row
    todo = [n for n in names if n not in rows]
    if todo:
        (out / "repos").mkdir(parents=True, exist_ok=True)
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 2, 8)) as pool:
            rows.update(zip(todo, pool.map(lambda n: _build_one(data / n, out), todo)))
    path = out / DATASET
    _write_atomic(path, "".join(json.dumps(rows[n], ensure_ascii=False) + "\n" for n in names))
    _write_atomic(out / STAMP, json.dumps({"version": BUILD_VERSION, "instances": hashes}, indent=1) + "\n")
    return path


def _build_one(src: Path, out: Path) -> dict[str, Any]:
    name = src.name
    instance = _read_instance(src)
    gold, tests = (src / "gold.patch").read_text(), (src / "test.patch").read_text()
    _check_touched(src / "gold.patch", gold, want_tests=False)
    _check_touched(src / "test.patch", tests, want_tests=True)
    with tempfile.TemporaryDirectory(prefix=f"swe-mini-{name}-") as tmp:
        base = Path(tmp, "base")
        shutil.copytree(src / "repo", base, ignore=shutil.ignore_patterns(*_IGNORED))
        _normalise_modes(base)
        _git(base, "-c", "init.defaultBranch=main", "init", "-q")
        _git(base, "add", "-A")
        _git(base, "commit", "-q", "-m", f"{instance['repo']}: base of {instance['instance_id']}")
        commit = _git(base, "rev-parse", "HEAD")
        bundle = Path(tmp, "base.bundle")
        _git(base, "bundle", "create", "-q", str(bundle), "--all")
        before = _statuses(bundle, tests, "", instance["test_cmd"], Path(tmp, "before"), src)
        after = _statuses(bundle, tests, gold, instance["test_cmd"], Path(tmp, "after"), src)
        passed_before = {t for t, s in before.items() if s in PASSING}
        passed_after = {t for t, s in after.items() if s in PASSING}
        f2p, p2p = sorted(passed_after - passed_before), sorted(passed_before & passed_after)
        broken = sorted(passed_before - passed_after)
        if broken or not f2p:
            no_f2p = "no test fails before the gold patch and passes after"
            raise ConfigError(f"the gold patch breaks {broken}" if broken else no_f2p, str(src))
        target = out / "repos" / f"{name}.bundle"
        partial = target.with_name(f".{name}.{os.getpid()}.tmp")
        shutil.copyfile(bundle, partial)
        os.replace(partial, target)
    return {
        **instance,
        "base_commit": commit,
        "patch": gold,
        "test_patch": tests,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "repo_path": f"repos/{name}.bundle",
    }


def _statuses(bundle: Path, test_patch: str, gold: str, test_cmd: str, where: Path, src: Path) -> dict[str, str]:
    """Clone the bundle, apply the patches (each checked first), run the tests, parse their log."""
    _git(None, "clone", "-q", "--no-hardlinks", str(bundle), str(where))  # never share objects with the source
    for label, text in (("test.patch", test_patch), ("gold.patch", gold)):
        if text:
            patch = where.parent / f"{where.name}-{label}"
            patch.write_text(text)
            if subprocess.run(["git", "apply", "--check", str(patch)], check=False, cwd=where, env=_env(_GIT_ENV),
                              capture_output=True).returncode != 0:
                raise ConfigError(f"{label} does not apply cleanly (git apply --check) to the base", str(src))
            _git(where, "apply", str(patch))
    env = _env({"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                "PYTEST_ADDOPTS": "-p no:cacheprovider"}, drop=("PYTHONPATH", "PY_COLORS", "FORCE_COLOR"))
    # ``python3`` in test_cmd is this interpreter (it has pytest), as it is the container's in the image.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    try:
        ran = subprocess.run(["bash", "-c", test_cmd], check=False, cwd=where, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=TEST_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"test_cmd took more than {TEST_TIMEOUT:g}s", str(src)) from None
    log = ran.stdout.decode("utf-8", errors="replace")
    statuses = parse_log_pytest(log)
    if not statuses:
        raise ConfigError(f"test_cmd reported no test (exit {ran.returncode}): {log[-2000:]}", str(src))
    # Two ids cut to the same word by the harness would share one status: give such tests ids.
    cut = collections.Counter(t.split()[0] for t in parse_test_statuses(log) if any(c.isspace() for c in t))
    if any(n > 1 for n in cut.values()):
        raise ConfigError(f"several test ids read as {sorted(k for k, n in cut.items() if n > 1)}", str(src))
    return statuses


def _read_instance(src: Path) -> dict[str, Any]:
    try:
        instance = json.loads((src / "instance.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"unreadable instance.json: {exc}", str(src)) from None
    missing = [k for k in _REQUIRED if not instance.get(k)]
    if missing:
        raise ConfigError(f"instance.json lacks {', '.join(missing)}", str(src))
    return instance


def _check_touched(path: Path, patch: str, want_tests: bool) -> None:
    files = [line.split(" b/", 1)[-1] for line in patch.splitlines() if line.startswith("diff --git ")]
    if not files:
        raise ConfigError("the patch changes no file", str(path))
    wrong = [f for f in files if _is_test_file(f) != want_tests]
    if wrong:
        raise ConfigError(f"{'non-test' if want_tests else 'test'} files in the patch: {', '.join(wrong)}", str(path))


def _is_test_file(path: str) -> bool:
    parts = path.split("/")
    return any(p in ("tests", "test", "testing") for p in parts[:-1]) or fnmatch.fnmatch(parts[-1], "test_*.py") \
        or fnmatch.fnmatch(parts[-1], "*_test.py") or parts[-1] == "conftest.py"


def _input_hash(src: Path) -> str:
    digest = hashlib.sha256(f"swe-mini build {BUILD_VERSION}\n".encode())
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src).as_posix()
        if any(fnmatch.fnmatch(part, pattern) for part in rel.split("/") for pattern in _IGNORED):
            continue
        digest.update(f"{rel}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _normalise_modes(root: Path) -> None:
    """Git records the executable bit: make it the same wherever the data was checked out."""
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() or path.suffix == ".sh" else 0o644)


def _load_stamp(out: Path) -> dict[str, str]:
    try:
        doc = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return doc.get("instances", {}) if doc.get("version") == BUILD_VERSION else {}


def _load_rows(path: Path) -> dict[str, dict[str, Any]]:
    """Rows of an earlier build by instance directory name (from ``repo_path``)."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return {}
    return {Path(str(r.get("repo_path", ""))).stem: r for r in rows}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _env(extra: dict[str, str], drop: tuple[str, ...] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def _git(cwd: Path | None, *args: str) -> str:
    done = subprocess.run(["git", *args], check=False, cwd=cwd, env=_env(_GIT_ENV), capture_output=True, timeout=120)
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", errors="replace").strip()[-1000:]
        raise ConfigError(f"git {' '.join(args[:3])} failed: {err}", str(cwd or ""))
    return done.stdout.decode("utf-8", errors="replace").strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m envs.swe.mini", description="Build the mini SWE benchmark.")
    parser.add_argument("out_dir", help="where repos/*.bundle and swe_mini.jsonl go")
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"instances to build (default: all in {DATA_DIR})")
    args = parser.parse_args(argv)
    print(build(args.out_dir, args.only))


if __name__ == "__main__":
    main()
