"""The synchronous and the asynchronous RL loop side by side, on the same machine in one session: for each seed,
``examples/rl_on_cpu.py`` once in each mode (same warm start, problems, samples and evaluation steps; the order
alternates across seeds so drift in the machine's load favours neither), then one table of wall time, held-out
reward, throughput, farm idle time and the staleness of the trained tokens, with the asynchronous wall time as a
ratio of the synchronous one's.

    python -m examples.rl_cpu.compare --seeds 0 1 --eval-every 5        # any further options go to both runs

Writes ``OUT/compare.json`` and each run's own directory (``OUT/seed<S>-<mode>``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODES = ("sync", "async")


def run(seed: int, mode: str, out: Path, warm: Path | None, passed: list[str]) -> dict[str, Any]:
    """One run of the example as its own process (its own Ray cluster); its metrics, with the load around it."""
    command = [sys.executable, str(ROOT / "examples" / "rl_on_cpu.py"), "--seed", str(seed), "--out", str(out),
               "--no-restart", *(["--async"] if mode == "async" else []), *(["--warm", str(warm)] if warm else []),
               *passed]
    print(f"== seed {seed}, {mode}: {' '.join(command[1:])}", flush=True)
    load = os.getloadavg()[0]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise SystemExit(f"seed {seed}, {mode}: the run failed (exit {done.returncode}); see {out}")
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["load"] = (load, os.getloadavg()[0])
    return metrics


def curve(metrics: dict[str, Any]) -> str:
    """Held-out sampled reward at step 0 and after each evaluated step."""
    points = [f"0:{metrics['baseline']['heldout']:.2f}"]
    points += [f"{r['step'] + 1}:{r['heldout']:.2f}" for r in metrics["steps"] if "heldout" in r]
    return " ".join(points)


COLUMNS = ("seed", "mode", "wall of the steps (of it evaluating)", "vs sync",
           "held-out before → after (gain; headroom closed)", "curve (step:reward)", "trained tok/s", "CPU busy",
           "farm idle", "tokens by staleness", "load")


def table(runs: dict[tuple[int, str], dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for (seed, mode), m in sorted(runs.items()):
        sync = runs.get((seed, "sync"))
        before = m["baseline"]["heldout"]
        cells = (seed, mode, f"{m['loop_s']:.1f} s ({m['eval_s']:.1f} s)",
                 f"{m['loop_s'] / sync['loop_s']:.2f}×" if sync and sync["loop_s"] else "-",
                 f"{before:.3f} → {before + m['gain']:.3f} ({m['gain']:+.3f}; {m['headroom_closed']:.0%})",
                 curve(m), f"{m['tokens_per_s']:.0f}",
                 f"{m['cpu_busy']:.0%}" if m.get("cpu_busy") is not None else "-", f"{m['farm_idle_s']:.1f} s",
                 m["staleness"],
                 f"{m['load'][0]:.1f}→{m['load'][1]:.1f}")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--out", default=str(ROOT / "runs" / "rl_compare"))
    args, passed = p.parse_known_args(argv)
    out = Path(args.out)
    started = time.perf_counter()
    runs: dict[tuple[int, str], dict[str, Any]] = {}
    for i, seed in enumerate(args.seeds):
        warm = None
        for mode in MODES if i % 2 == 0 else MODES[::-1]:
            runs[(seed, mode)] = run(seed, mode, out / f"seed{seed}-{mode}", warm, passed)
            warm = warm or out / f"seed{seed}-{mode}" / "warm"
    text = table(runs)
    print(text, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(
        {"argv": passed, "seconds": time.perf_counter() - started, "table": text,
         "runs": {f"seed{s}-{m}": v for (s, m), v in runs.items()}}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
