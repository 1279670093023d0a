"""Grading overhead per instance of the bundled mini benchmark: our grader vs the bare test run.

    python tests/perf/bench_grading.py [--repeat 3] [--only rle roman] [--base rollout-farm/base:bookworm]
    python tests/perf/bench_grading.py --corpus [--repeat 1] [--only pluggy-7aef3e6 ...]

For each instance (images built first if missing), side by side, one at a time, medians of ``--repeat``:

- grading: ``envs.swe.grading.grade.grade`` of the gold patch in a fresh DockerRuntime of the instance image
  (start, then one exec running the snapshot of pytest's configuration, the patch ladder, test reset, test patch,
  canaries and the tests through the pinned launcher; container removed), canaries in place (else it stops);
- bare: the docker CLI, ``docker run --rm -i --network none <image> bash -c "git apply - && <test_cmd>"``
  with the gold and test patches on stdin, so both run the same tests in a fresh container of the same image (a 5.x
  row: its own eval script instead of ``test_cmd``, only the gold patch on stdin, as the script applies its test
  patch).

``--corpus``: the conformance corpus (tests/corpus, real bug fixes of real projects) instead of the mini
benchmark. A gold patch graded unresolved there is a false alarm (the grader failing an honest fix): it is counted
and printed beside the ratio (it must be 0), the instance's time still counts, and the bare side accepts the
test command's exit 1 (a project's test file may hold tests that fail at the fix too; the grader reads per test).

Target: grading <= 1.3x bare, per instance and overall (sum of medians). "extra s" is the grader's fixed
cost per instance (about one engine round trip, ~65 ms here, plus the patch steps): with these
sub-second test runs it shows in the ratio; with the minutes SWE-bench suites take, it is noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sides import Side, failed, one_line, ratio  # noqa: E402

from envs.images.image_names import DEFAULT_BASE_IMAGE, image_for
from envs.images.instance_images import build_instance_images
from envs.runtimes.docker.containers import owner_labels
from envs.runtimes.docker.runtime import DockerRuntime
from envs.swe.grading.grade import grade
from envs.swe.mini import build

RUN_ID = "bench-grading"
TARGET = 1.3
CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "data" / "corpus.jsonl"


class SideFailed(Exception):
    """One side of an instance did not do its work (the message says how)."""


def bare(row: dict, image: str, ok_codes: tuple[int, ...] = (0,)) -> float:
    script = row.get("eval_script")  # a 5.x row's own script applies its test patch and runs its tests
    patches = row["patch"] + ("" if script else row["test_patch"])  # disjoint files: one patch git applies at once
    command = f"bash -c {shlex.quote(script)}" if script else row["test_cmd"]
    # The owner's labels too: another session's reaper removes a labelled container whose owner it cannot see.
    owner = [arg for key, value in owner_labels().items() for arg in ("--label", f"{key}={value}")]
    argv = ["docker", "run", "--rm", "-i", "--network", "none", "--label", f"rollout-farm.run={RUN_ID}", *owner,
            image, "bash", "-c", f"git apply - && {command}"]
    began = time.perf_counter()
    done = subprocess.run(argv, check=False, input=patches.encode(), capture_output=True)
    seconds = time.perf_counter() - began
    if done.returncode not in ok_codes:
        raise SideFailed(f"exit {done.returncode}: {one_line(done.stdout.decode(errors='replace'))}")
    return seconds


async def graded(row: dict, image: str, alarms: list[str] | None = None) -> tuple[float, dict[str, float]]:
    """Seconds and phases of grading the gold patch; with ``alarms`` (the corpus) an unresolved gold patch is
    appended there (a false alarm) instead of failing the side."""
    def fresh() -> DockerRuntime:
        return DockerRuntime({"image": image, "workdir": "/testbed"}, run_id=RUN_ID, rollout_id="grade")

    began = time.perf_counter()
    result = await grade(row, row["patch"], fresh, eval_timeout=300)
    seconds = time.perf_counter() - began
    if alarms is not None and not result.resolved:
        alarms.append(f"{row['instance_id']}: {one_line(result.unresolved_reason or result.test_output)}")
    elif not result.resolved or not (result.canaries or row.get("eval_script")):  # its own runner: no canaries
        raise SideFailed(f"the gold patch did not resolve with canaries in place ({result.canaries}): "
                         f"{one_line(result.unresolved_reason or result.test_output)}")
    return seconds, result.durations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side per instance (medians)")
    parser.add_argument("--only", nargs="+", default=None, help="instance directory names (default: all)")
    parser.add_argument("--base", default=DEFAULT_BASE_IMAGE, help="base image of the instance images")
    parser.add_argument("--corpus", action="store_true", help="the conformance corpus (tests/corpus), all of it")
    args = parser.parse_args(argv)
    alarms: list[str] | None = [] if args.corpus else None
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        dataset = corpus_dataset(Path(tmp), args.only) if args.corpus else build(tmp, args.only)
        report = build_instance_images(dataset, base=args.base, progress=lambda line: None,
                                       allow_outside_paths=args.corpus)
        if report.failed:
            raise SystemExit(f"image builds failed: {report.failed}")
        rows = [json.loads(line) for line in dataset.read_text().splitlines()]
        width = max([22] + [len(r["instance_id"]) for r in rows]) if args.corpus else 22
        print(f"{'instance':<{width}} {'bare s':>7} {'grading s':>9} {'extra s':>7} {'ratio':>6}"
              "   grading phases (median s)")
        totals = [0.0, 0.0]
        worst = 0.0
        problems: list[str] = []
        for row in rows:
            image = image_for(row, args.base)
            bare_runs, grade_runs, errors = [], [], {"bare": "", "grading": ""}
            codes = (0, 1) if args.corpus else (0,)
            runs = {"bare": (bare_runs, lambda: bare(row, image, codes)),
                    "grading": (grade_runs, lambda: asyncio.run(graded(row, image, alarms)))}
            for turn in range(args.repeat):  # alternate which side goes first: the machine warms up
                for side in (("grading", "bare") if turn % 2 else ("bare", "grading")):
                    try:
                        runs[side][0].append(runs[side][1]())
                    except Exception as exc:  # noqa: BLE001 - a side that did not do its work says so, no ratio
                        errors[side] = errors[side] or (str(exc) if isinstance(exc, SideFailed)
                                                        else f"{type(exc).__name__}: {one_line(str(exc))}")
            sides = [Side(side, args.repeat, len(runs[side][0]), errors[side]) for side in ("bare", "grading")]
            if failed(*sides):
                problems.append(row["instance_id"])
                print(f"{row['instance_id']:<{width}} {failed(*sides)}", flush=True)
                continue
            b = statistics.median(bare_runs)
            g = statistics.median(s for s, _ in grade_runs)
            phases = {k: statistics.median(d[k] for _, d in grade_runs) for k in grade_runs[0][1]}
            totals[0] += b
            totals[1] += g
            worst = max(worst, g / b)
            shown = " ".join(f"{k} {v:.2f}" for k, v in phases.items())
            print(f"{row['instance_id']:<{width}} {b:7.2f} {g:9.2f} {g - b:7.2f} {ratio(g, b):>6}   {shown}",
                  flush=True)
        false_alarms = "" if alarms is None else f"; false alarms (gold unresolved, must be 0): {len(alarms)}"
        for alarm in alarms or []:
            print(f"false alarm: {alarm}")
        if problems:
            print(f"{'overall (sum)':<{width}} no ratio: {len(problems)}/{len(rows)} instances failed a side "
                  f"({', '.join(problems)}){false_alarms}")
            return 1
        overall = totals[1] / totals[0]
        print(f"{'overall (sum)':<{width}} {totals[0]:7.2f} {totals[1]:9.2f} {totals[1] - totals[0]:7.2f} "
              f"{overall:5.2f}x   worst instance {worst:.2f}x; target <= {TARGET}x: "
              f"{'met' if overall <= TARGET else 'NOT met'}{false_alarms}")
    return 1 if alarms else 0


def corpus_dataset(where: Path, only: list[str] | None) -> Path:
    """The corpus's rows (``--only``: instance names, as in tests/corpus/spec.json) with absolute bundle paths,
    but those whose grading is known to hang (tests/corpus/known_failures.json), each named on a line."""
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    hangs = json.loads((CORPUS.parents[1] / "known_failures.json").read_text())["grading_hangs"]
    for name, why in hangs.items():
        print(f"left out: {name} (known hang: {why})")
    rows = [r for r in rows if r["instance_id"].split("-corpus-", 1)[1] not in hangs]
    if only:
        rows = [r for r in rows if r["instance_id"].split("-corpus-", 1)[1] in only]
    for row in rows:
        row["repo_path"] = str(CORPUS.parent / row["repo_path"])
        row.pop("image", None)  # a 5.x row's image is only a name: built from repo_path as the others are
    path = where / "corpus.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


if __name__ == "__main__":
    sys.exit(main())
