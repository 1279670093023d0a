"""A small run as a new user makes it: ten SWE instances, gold policy, concurrency 2; the farm vs mini-swe-agent.

    python tests/perf/bench_small_run.py [--rounds 3] [--instances 10] [--no-warmup] [--mini-python PATH]

Both sides run the first ``--instances`` rows of the bundled mini benchmark (``envs.swe.mini``) in their
per-instance docker images (``rollout images build``: built first if missing, untimed), two at a time, each in a
process of its own, timed from its start to its exit, alternating farm and mini-swe-agent round by round:

- farm: ``rollout run configs/swe_demo.yaml dataset.slice=0:N run.concurrency=2 --new-run`` (the README's first
  command): an embedded Ray cluster, the ``gold`` policy as a 2-replica Ray Serve app, one worker actor, a
  container per rollout, grading in a fresh container inside each rollout, the run directory and its SWE outputs.
  Its start-up split (seconds to the first model call, by part) comes from its summary.json.
- mini-swe-agent 2.4.6's SWE-bench batch runner (``python -m minisweagent.run.benchmarks.swebench -w 2``, its
  ``swebench.yaml`` config and ``DockerEnvironment``) on the same rows with ``image_name`` set to our instance
  images (no registry is reachable here), and a deterministic model (its ``DeterministicModel`` with per-instance
  outputs) that does what our ``gold`` policy does: write the reference patch, ``git apply`` it, submit the
  staged diff, one command per turn. Then grading, as its workflow has it, a second step on its preds.json:
  ``rollout eval --workers 2``, our grader (the one the farm runs inside each rollout, a fresh container per
  instance), so both sides grade alike; swebench's harness cannot grade these repositories (its specs name
  SWE-bench's repositories only). Its wall time is the two steps'. It stops its containers in the background
  after it exits (``docker stop``, ten seconds each); they are removed after its round, untimed.

mini-swe-agent runs from ``--mini-python``, else from this interpreter when it has it, else from a virtualenv the
bench makes once in the temp directory (``pip install mini-swe-agent==2.4.6``: the project does not depend on
it). A warm-up round of each side (untimed: page cache, mini-swe-agent's dataset cache) comes first unless
``--no-warmup``. A third side runs the farm's same command in one process (``farm.backend=local``, what
``--local`` sets: no Ray cluster, the gold policy from the run's in-process scripted server), which separates
the rollouts' own cost from Ray's and Serve's start-up. The table gives the median wall time of each side, the
machine's busy CPU-seconds meanwhile (every process: containers, the docker daemon, Ray's), the farm's
start-up split, and the ratios to mini-swe-agent (target <= 1.0x for the Ray run); its last line is the Ray run's
CPU floor, its CPU-seconds over the machine's cores: the least wall time any overlap of its parts could reach
here. A fourth side (unless ``--no-standing``) is the same command with ``--address`` on a standing cluster: a
local Ray cluster started once in a process of its own (``_standing_cluster.py``, untimed, stopped at the end) and a
first run on it (untimed: it deploys the model's Serve application, which ``serve.keep=true`` leaves up, with a
``serve.api_key`` of the cluster's so that later runs may reuse it), then one timed run per round, which reuses that
application and the worker actors the run before kept (``cluster.workers.kept``; its log and summary say so; the
table counts both, with that side's start-up split; target <= 1.15x). The standing cluster idles beside the other
sides' runs. A side that did not resolve every instance gets no ratio; the line under the table says why. The bench
exits 0 either way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sides import Side, failed, one_line, ratio  # noqa: E402
from _standing_cluster import StandingCluster  # noqa: E402

from envs.images.base_image import ensure_image
from envs.images.image_names import DEFAULT_BASE_IMAGE, image_for
from envs.images.instance_images import build_instance_images
from envs.swe.mini import build

REPO = Path(__file__).resolve().parents[2]
MINI_VERSION = "2.4.6"
TARGET = 1.0
STANDING_TARGET = 1.15
"""A later run on a standing cluster (its model app and its workers kept from the run before)."""
GOLD_MODEL = '''
import json, os
from minisweagent.models.test_models import DeterministicModel, make_output

SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class GoldModel(DeterministicModel):
    """The reference patch of the instance named in the task: write it, git apply it, submit the staged diff."""

    def __init__(self, **kwargs):
        keep = {k: kwargs[k] for k in ("model_name", "observation_template") if k in kwargs}
        super().__init__(outputs=[], cost_per_call=0.0, **keep)

    def query(self, messages, **kwargs):
        if not self.config.outputs:
            with open(os.environ["GOLD_DATASET"]) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            text = "\\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
            row = next(r for r in rows if r["problem_statement"] in text)
            patch = row["patch"] if row["patch"].endswith("\\n") else row["patch"] + "\\n"
            path = "/tmp/rollout-gold.patch"
            self.config.outputs = [
                make_output("Write the patch.", [{"command": f"cat > {path} <<'GOLD_EOF'\\n{patch}GOLD_EOF"}], 0.0),
                make_output("Apply it.", [{"command": f"git apply {path}; code=$?; rm -f {path}; exit $code"}], 0.0),
                make_output("Submit.", [{"command": f"echo {SENTINEL} && git add -A && git diff --cached"}], 0.0),
            ]
        return super().query(messages, **kwargs)
'''


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the farm starts its own cluster
    env.update(extra)
    return env


def mini_python(given: str | None, tmp: Path) -> str:
    if given:
        return given
    probe = subprocess.run([sys.executable, "-c", "import minisweagent"], capture_output=True)
    if probe.returncode == 0:
        return sys.executable
    venv = Path(tempfile.gettempdir()) / f"bench-small-run-mini-{MINI_VERSION}"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"installing mini-swe-agent=={MINI_VERSION} into {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"mini-swe-agent=={MINI_VERSION}"], check=True)
    return str(python)


def busy_cpu() -> float:
    """CPU-seconds this machine has spent busy since boot (all processes: containers, docker, Ray's daemons), from
    /proc/stat; NaN where there is none."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    # user, nice, system, idle, iowait, irq, softirq: all but idle and iowait (steal is time another guest had)
    return (sum(ticks[:7]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def timed(argv: list[str], env: dict[str, str], log: Path) -> tuple[float, int, float]:
    """Wall seconds, exit code and the machine's busy CPU-seconds meanwhile."""
    began, cpu = time.perf_counter(), busy_cpu()
    with open(log, "w") as out:
        code = subprocess.run(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return time.perf_counter() - began, code, busy_cpu() - cpu


ONE_PROCESS = ["farm.backend=local"]
"""The same command in one process (``rollout run --local``): the local backend, whose scripted ``serve`` app is
played by the run's in-process scripted server instead of a Ray Serve application (no Ray cluster starts)."""


def farm_round(tmp: Path, n: int, label: str, one_process: bool = False, cluster: StandingCluster | None = None
               ) -> dict:
    home = tmp / "farm"
    kind = "one-" if one_process else "standing-" if cluster else ""
    run_id = f"bench-small-{kind}{label}"
    argv = [sys.executable, "-m", "cluster", "run", "configs/swe_demo.yaml", f"dataset.slice=0:{n}",
            "run.concurrency=2", f"run_id={run_id}", "--new-run", *(ONE_PROCESS if one_process else []),
            *(["--address", cluster.address, "serve.keep=true", f"serve.api_key={cluster.api_key}"]
              if cluster else [])]
    env = clean_env(ROLLOUT_HOME=str(home), **({"RAY_AUTH_MODE": "token"} if cluster else {}))
    wall, code, cpu = timed(argv, env, tmp / f"{run_id}.log")
    log = tmp / f"{run_id}.log"
    summary_path = home / run_id / "summary.json"
    summary = json.loads(summary_path.read_text()) if code == 0 and summary_path.exists() else {}
    resolved = (summary.get("swe") or {}).get("resolved_instances") or 0
    text = log.read_text(errors="replace") if log.exists() else ""
    kept = summary.get("kept_workers") or {}
    return {"wall": wall, "cpu": cpu, "ok": code == 0 and resolved == n, "resolved": resolved,
            "error": farm_error(code, home / run_id, log), "startup": summary.get("startup"), "log": log,
            "reused": "options and policy: reused" in text,
            "workers_reused": bool(kept.get("reused")) and not kept.get("started"),
            "workers_refused": next((line.split(": ", 1)[1] for line in text.splitlines()
                                     if "[farm] kept worker" in line and "is not reused: " in line), "")}


def farm_error(code: int, run_dir: Path, log: Path) -> str:
    """The first failed rollout's error (results.jsonl), else the exit code and the log's last line."""
    results = run_dir / "results.jsonl"
    for line in (results.read_text().splitlines() if results.exists() else []):
        row = json.loads(line) if line.strip() else {}
        if row.get("status") not in (None, "completed") or row.get("error"):
            error = row.get("error") or {}
            return f"{row.get('task_id')}: {row.get('status')} {error.get('type', '')}: {error.get('message', '')}"
        if row.get("reward") not in (None, 1.0):
            return f"{row.get('task_id')}: unresolved ({row.get('exit_reason')})"
    return f"exit {code}: {one_line(log.read_text(errors='replace'))}" if code else ""


def mini_round(tmp: Path, python: str, data: Path, dataset: Path, n: int, label: str) -> dict:
    out = tmp / f"mini-{label}"
    env = clean_env(GOLD_DATASET=str(data / "test.jsonl"), PYTHONPATH=str(tmp / "model"), MSWEA_SILENT_STARTUP="1",
                    HF_DATASETS_CACHE=str(tmp / "hf-cache"), HF_HUB_OFFLINE="1")
    agent, code, agent_cpu = timed([python, "-m", "minisweagent.run.benchmarks.swebench", "--subset", str(data),
                                    "--split", "test", "-w", "2", "-o", str(out), "--model-class",
                                    "bench_gold_model.GoldModel", "-m", "gold"], env, tmp / f"mini-{label}.log")
    remove_mini_containers()
    grading, graded, grading_cpu = timed([sys.executable, "-m", "cluster", "eval", "--dataset", str(dataset),
                                          "--predictions", str(out / "preds.json"), "--out", str(tmp / f"eval-{label}"),
                                          "--workers", "2"], clean_env(), tmp / f"eval-{label}.log")
    reports = list((tmp / f"eval-{label}").glob("*.json"))
    resolved = (json.loads(reports[0].read_text()).get("resolved_instances") if reports else None) or 0
    log = tmp / f"mini-{label}.log"
    error = mini_error(code, out, log) or (f"rollout eval exit {graded}: "
                                           f"{one_line((tmp / f'eval-{label}.log').read_text(errors='replace'))}"
                                           if graded else "")
    return {"wall": agent + grading, "cpu": agent_cpu + grading_cpu, "agent": agent, "grading": grading,
            "resolved": resolved, "error": error, "ok": code == 0 and graded == 0 and resolved == n, "log": log}


def mini_error(code: int, out: Path, log: Path) -> str:
    """mini-swe-agent's first failed instance: its log's "Error processing instance" line (an environment that
    did not start leaves no trajectory), else a trajectory whose exit status is not Submitted, else its exit code."""
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        if "Error processing instance" in line:
            return one_line(line)
    for traj in sorted(out.glob("*/*.traj.json")):
        info = json.loads(traj.read_text()).get("info") or {}
        if info.get("exit_status") != "Submitted":
            return f"{traj.parent.name}: {info.get('exit_status')} {info.get('exception_str', '')}".strip()
    return f"exit {code}: {one_line(text)}" if code else ""


def remove_mini_containers() -> None:
    """mini-swe-agent stops its containers in the background after it exits: take them away now (untimed)."""
    ids = subprocess.run(["docker", "ps", "-aq", "--filter", "name=minisweagent-"], capture_output=True,
                         text=True).stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)


def setup(tmp: Path, n: int) -> tuple[Path, Path]:
    """The dataset the demo config generates, its images, and mini-swe-agent's copy of the first ``n`` rows."""
    dataset = build(REPO / "runs" / "datasets" / "swe_mini")  # where configs/swe_demo.yaml generates it
    rows = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()][:n]
    ensure_image(DEFAULT_BASE_IMAGE)
    report = build_instance_images(dataset, progress=lambda line: None)
    if report.failed:
        raise SystemExit(f"image builds failed: {report.failed}")
    data = tmp / "data"
    data.mkdir()
    with open(data / "test.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps({**row, "image_name": image_for(row)}) + "\n")
    (tmp / "model").mkdir()
    (tmp / "model" / "bench_gold_model.py").write_text(GOLD_MODEL)
    return dataset, data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each side (medians)")
    parser.add_argument("--instances", type=int, default=10, help="the first N rows of the mini benchmark")
    parser.add_argument("--no-warmup", action="store_true", help="no untimed round of each side first")
    parser.add_argument("--mini-python", default=None, help="an interpreter that has mini-swe-agent")
    parser.add_argument("--no-standing", action="store_true", help="no runs on a standing cluster (--address)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-small-run-") as name:
        tmp = Path(name)
        dataset, data = setup(tmp, args.instances)
        python = mini_python(args.mini_python, tmp)
        walls: dict[str, list[dict]] = {"farm": [], "one": [], "mini": [], "standing": []}
        cluster = None if args.no_standing else StandingCluster(num_cpus=os.cpu_count() or 2).start()  # untimed
        try:
            if cluster is not None:  # its first run deploys the model's app (untimed): the rounds' runs are later
                first = farm_round(tmp, args.instances, "first", cluster=cluster)
                print(f"standing cluster at {cluster.address}: first run {first['wall']:.1f}s"
                      + ("" if first["ok"] else f" FAILED: {first['error']}"), flush=True)
            run_rounds(tmp, args, python, data, dataset, cluster, walls)
        finally:
            if cluster is not None:
                cluster.stop()
        print_table(walls, args)
    return 0


def run_rounds(tmp: Path, args: argparse.Namespace, python: str, data: Path, dataset: Path,
               cluster: StandingCluster | None, walls: dict[str, list[dict]]) -> None:
    for index in range(0 if args.no_warmup else -1, args.rounds):
        label = "warmup" if index < 0 else str(index)
        sides = [("farm", lambda: farm_round(tmp, args.instances, label)),
                 ("mini", lambda: mini_round(tmp, python, data, dataset, args.instances, label)),
                 ("one", lambda: farm_round(tmp, args.instances, label, one_process=True))]
        if cluster is not None:
            sides.append(("standing", lambda: farm_round(tmp, args.instances, label, cluster=cluster)))
        shift = index % len(sides)
        for side, run in sides[shift:] + sides[:shift]:  # rotate which side goes first
            result = run()
            result["side"] = Side(NAMES[side], args.instances, result["resolved"], result["error"])
            if not result["ok"]:
                print(f"{side} round {label}: {result['side'].failure()}; its log's end:\n"
                      + result["log"].read_text(errors="replace")[-3000:], flush=True)
            if index >= 0:
                walls[side].append(result)
        print(f"round {label}: " + ", ".join(f"{NAMES[k]} {v[-1]['wall']:.1f}s" for k, v in walls.items() if v)
              if index >= 0 else "warm-up done", flush=True)


NAMES = {"farm": "farm (Ray, Serve)", "one": "farm (one process)", "mini": f"mini-swe-agent {MINI_VERSION}",
         "standing": "farm (standing cluster)"}


def side_of(name: str, rounds: list[dict]) -> Side:
    """A side over its rounds: every instance of every round resolved, or its first round's failure."""
    total = sum(r["side"].total for r in rounds)
    done = sum(r["side"].done for r in rounds)
    error = next((r["side"].error or r["side"].failure() for r in rounds if not r["side"].ok), "")
    return Side(NAMES[name], total, done, error)


def print_table(walls: dict[str, list[dict]], args: argparse.Namespace) -> None:
    farm, mini, one, standing = walls["farm"], walls["mini"], walls["one"], walls["standing"]
    med = lambda rs, key="wall": statistics.median(r[key] for r in rs)  # noqa: E731
    f_wall, m_wall, o_wall = med(farm), med(mini), med(one)
    best = min(farm, key=lambda r: abs(r["wall"] - f_wall))
    split = best["startup"] or {}
    parts = ", ".join(f"{k} {v:.1f}" for k, v in (split.get("parts") or {}).items())
    sides = {name: side_of(name, rs) for name, rs in walls.items() if rs}
    rounds = lambda rs: " ".join(f"{r['wall']:.1f}" for r in rs)  # noqa: E731
    print(f"\n{args.instances} SWE instances (bundled mini benchmark), gold policy, concurrency 2; "
          f"{args.rounds} round(s), medians; wall = process start to exit; CPU = the machine's busy CPU-seconds")
    print(f"{'system':<34} {'wall s':>7} {'CPU s':>6}   {'rounds':<18} notes")
    seconds = split.get("seconds", float("nan"))
    print(f"{'farm: rollout run (Ray, Serve)':<34} {f_wall:7.1f} {med(farm, 'cpu'):6.1f}   {rounds(farm):<18} "
          f"start-up {seconds:.1f}s to the first model call (median round: {parts}); then rollouts, "
          f"teardown and exit {best['wall'] - seconds:.1f}s")
    o_split = min(one, key=lambda r: abs(r["wall"] - o_wall))["startup"] or {}
    print(f"{'farm: one process (no Ray)':<34} {o_wall:7.1f} {med(one, 'cpu'):6.1f}   {rounds(one):<18} "
          f"the same command + {' '.join(ONE_PROCESS)}; {o_split.get('seconds', float('nan')):.1f}s to the first call")
    if standing:
        s_wall = med(standing)
        s_split = min(standing, key=lambda r: abs(r["wall"] - s_wall))["startup"] or {}
        reused = sum(1 for r in standing if r["reused"])
        kept = sum(1 for r in standing if r["workers_reused"])
        print(f"{'farm: --address, standing cluster':<34} {s_wall:7.1f} {med(standing, 'cpu'):6.1f}   "
              f"{rounds(standing):<18} a later run on a running cluster (started once, untimed); model app reused in "
              f"{reused}/{len(standing)} runs, workers reused in {kept}/{len(standing)}{refusals(standing)}; "
              f"{s_split.get('seconds', float('nan')):.1f}s to the first call "
              f"({', '.join(f'{k} {v:.1f}' for k, v in (s_split.get('parts') or {}).items())}); then rollouts, "
              f"teardown and exit {s_wall - s_split.get('seconds', float('nan')):.1f}s")
    print(f"{'mini-swe-agent ' + MINI_VERSION + ' + rollout eval':<34} {m_wall:7.1f} {med(mini, 'cpu'):6.1f}   "
          f"{rounds(mini):<18} batch runner {med(mini, 'agent'):.1f} + grading {med(mini, 'grading'):.1f}")
    ratios = [("farm", "farm", farm, f_wall, f"target <= {TARGET}x (a cluster started for the run)"),
              ("one", "one process", one, o_wall, "the gap above is Ray's and Serve's start-up")]
    if standing:
        ratios.insert(1, ("standing", "standing cluster", standing, med(standing),
                          f"target <= {STANDING_TARGET}x (model app and workers kept)"))
    for name, label, rs, wall, note in ratios:
        print_ratio(f"ratio {label} / mini-swe-agent", wall, m_wall, rs, mini, note, sides[name], sides["mini"])
    for name, side in sides.items():
        if not side.ok:
            print(f"{NAMES[name]} did not do the work: {side.failure()}")
    cores = os.cpu_count() or 1
    floor = med(farm, "cpu") / cores
    if failed(*sides.values()):
        return
    print(f"CPU floor of the Ray run on {cores} cores: {med(farm, 'cpu'):.1f} CPU-s / {cores} = {floor:.1f}s even with "
          f"every part overlapped ({floor / m_wall:.2f}x mini-swe-agent's wall); Ray and Serve cost "
          f"{med(farm, 'cpu') - med(one, 'cpu'):.1f} CPU-s over the one-process run")


def refusals(rounds: list[dict]) -> str:
    """Why kept workers were not reused in some rounds (their imported files changed since: a new process then)."""
    refused = [r["workers_refused"] for r in rounds if r["workers_refused"]]
    return f" ({len(refused)} kept worker(s) refused the lease: {refused[0]})" if refused else ""


def print_ratio(name: str, ours: float, base: float, ours_rounds: list[dict], base_rounds: list[dict], note: str,
                *sides: Side) -> None:
    """One ratio row: the medians' ratio and each round's, or why there is none (a side that did not do the work)."""
    shown = ratio(ours, base, *sides)
    if shown.startswith("no ratio"):
        print(f"{name:<34} {shown}")
        return
    per_round = " ".join(ratio(a["wall"], b["wall"], a["side"], b["side"]) if a["side"].ok and b["side"].ok else "-"
                         for a, b in zip(ours_rounds, base_rounds))
    target = float(note.split("<= ")[1].split("x")[0]) if note.startswith("target") else None
    met = f": {'met' if ours / base <= target else 'NOT met'}" if target is not None else ""
    print(f"{name:<34} {shown:>7} {'':>6}   {per_round:<18} {note}{met}")


if __name__ == "__main__":
    sys.exit(main())
