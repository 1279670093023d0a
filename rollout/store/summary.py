"""Run summaries: reward mean, pass@k, resolved rate, outcome counts (infrastructure failures apart); the live
status line is ``rollout.store.progress`` (its names are importable from here too).

A rollout *succeeds* when its reward is at least ``success_threshold`` (default 1.0: binary
tasks such as SWE-bench, where 1.0 means resolved). Infrastructure failures are never scored:
they stay out of the reward mean and out of pass@k, and are counted on their own; so is a completed rollout
without a verdict (reward None: the agent server's ``/v1/responses``), counted only as completed.
"""

from __future__ import annotations

from math import comb
from typing import Any, Iterable

from rollout.records import RolloutResult
from rollout.store.files import StoredResult
from rollout.store.progress import Progress, ProgressDisplay, count_by, format_progress
from rollout.store.resume import latest_per_key

__all__ = ["Progress", "ProgressDisplay", "format_progress", "format_startup", "format_table", "pass_at_k",
           "summarize"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with ``n`` scored samples, ``c`` of them successes: 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(
    results: Iterable[RolloutResult],
    k_values: Iterable[int] = (1,),
    success_threshold: float = 1.0,
    wall_seconds: float | None = None,
    ran: int | None = None,
    startup: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Numbers for summary.json over the latest result per (task, sample).

    pass@k averages the per-task estimate over tasks with at least k scored samples (tasks
    with fewer are left out, and ``pass_at_k_tasks`` says how many counted). ``resolved_rate``
    is the share of scored tasks with any success; ``resolved_of_all`` divides by every task,
    counting tasks that only ever failed on infrastructure as unresolved. Throughput is ``ran``
    (the rollouts finished during ``wall_seconds``; default: all given) per wall second, so a
    resumed run does not count what an earlier session did. ``startup`` (the seconds before the first model call,
    split by part: ``{"seconds", "parts": {name: seconds}, "side_by_side": [names]}``) is kept as given.
    """
    latest = latest_per_key(results)
    completed = [r for r in latest if r.status == "completed"]
    failed = [r for r in latest if r.status != "completed"]
    scored_results = [r for r in completed if r.reward is not None]
    rewards = [r.reward for r in scored_results]

    per_task: dict[str, list[bool]] = {}
    for r in latest:
        per_task.setdefault(r.task_id, [])
    for r, reward in zip(scored_results, rewards):
        per_task[r.task_id].append(reward >= success_threshold)
    scored = {t: s for t, s in per_task.items() if s}
    resolved = sum(any(s) for s in scored.values())

    pass_k: dict[str, float | None] = {}
    pass_k_tasks: dict[str, int] = {}
    for k in sorted(set(k_values)):
        eligible = [s for s in scored.values() if len(s) >= k]
        pass_k[str(k)] = _mean([pass_at_k(len(s), sum(s), k) for s in eligible])
        pass_k_tasks[str(k)] = len(eligible)

    prompt_tokens = sum(r.usage.prompt_tokens for r in latest)
    completion_tokens = sum(r.usage.completion_tokens for r in latest)
    return {
        "rollouts": {"total": len(latest), "completed": len(completed), "infra_failed": len(failed)},
        "tasks": {"total": len(per_task), "scored": len(scored), "resolved": resolved},
        "success_threshold": success_threshold,
        "reward_mean": _mean(rewards),
        "success_rate": _mean([reward >= success_threshold for reward in rewards]),
        "pass_at_k": pass_k,
        "pass_at_k_tasks": pass_k_tasks,
        "resolved_rate": resolved / len(scored) if scored else None,
        "resolved_of_all": resolved / len(per_task) if per_task else None,
        "exit_reasons": count_by(r.exit_reason.value for r in completed),
        "infra_failures": {
            "by_exit_reason": count_by(r.exit_reason.value for r in failed),
            "by_error_type": count_by(r.error.type if r.error else "unknown" for r in failed),
            "first_message_by_error_type": _first_messages(failed),
        },
        "retried": _retried(latest),
        "steps_mean": _mean([_num_steps(r) for r in completed]),
        "tokens": {
            "prompt": prompt_tokens,
            "completion": completion_tokens,
            "total": sum(r.usage.total_tokens for r in latest),
            "completion_mean": completion_tokens / len(latest) if latest else None,
        },
        "wall_seconds": wall_seconds,
        "rollouts_per_second": (len(latest) if ran is None else ran) / wall_seconds if wall_seconds else None,
        "startup": startup,
    }


def format_table(summary: dict[str, Any]) -> str:
    """A compact plain-text view of ``summarize``'s output for the terminal."""
    ro, tasks = summary["rollouts"], summary["tasks"]
    rows = [
        ("rollouts", f"{ro['total']}  (completed {ro['completed']}, infra_failed {ro['infra_failed']})"),
        ("tasks", f"{tasks['total']}  (scored {tasks['scored']}, resolved {tasks['resolved']})"),
        ("reward mean", _num(summary["reward_mean"])),
    ]
    for k, value in summary["pass_at_k"].items():
        rows.append((f"pass@{k}", f"{_num(value)}  over {summary['pass_at_k_tasks'][k]} tasks"))
    rows.append(("resolved rate", _num(summary["resolved_rate"])))
    rows.append(("exit reasons", _pairs(summary["exit_reasons"])))
    infra = summary["infra_failures"]
    rows.append(("infra failures", _pairs(infra["by_exit_reason"]) + _types(infra["by_error_type"])))
    for kind, message in (infra.get("first_message_by_error_type") or {}).items():
        rows.append(("", f"{kind}: {_one_line(message)}"))
    retried = summary.get("retried") or {}
    if retried.get("attempts"):
        rows.append(("retried", f"{retried['attempts']} attempts ({_pairs(retried['by_exit_reason'])}), "
                                f"{retried['seconds']:.1f}s of work ran again"))
    for node in summary.get("nodes_lost") or []:
        cost = (retried.get("by_node") or {}).get(node, {})
        why = (summary.get("nodes_lost_why") or {}).get(node)
        rows.append(("node lost", f"{node[:8]}: {cost.get('attempts', 0)} attempts ran again elsewhere "
                                  f"({cost.get('seconds', 0.0):.1f}s of work)" + (f"; {why}" if why else "")))
    for outage in (summary.get("model_tier") or {}).get("outages", []):
        back = ("not all running again by the end" if outage["seconds"] is None else
                f"recovered: all {summary['model_tier']['replicas']} running again after {outage['seconds']:.1f}s"
                if outage["seconds"] else "recovered: its replacement was running by the look that saw it lost")
        rows.append(("model tier", f"{outage['lost']} of {summary['model_tier']['replicas']} replicas lost "
                                   f"{outage['at']:.0f}s into the run; {back}"))
    moved = (summary.get("transfers") or {}).get("total") or {}
    if moved.get("images") or moved.get("file_bytes"):
        nodes = summary["transfers"]["by_node"]
        rows.append(("moved to nodes", f"{moved['images']} images ({_size(moved['bytes'])} in {moved['seconds']:.1f}s)"
                                       f", files {_size(moved['file_bytes'])}; images per node: "
                                       + ", ".join(f"{n[:8]} {v['images']}" for n, v in nodes.items())))
    rows.append(("steps mean", _num(summary["steps_mean"], 1)))
    rows.append(("tokens", f"{summary['tokens']['total']}"))
    if summary.get("rollouts_per_second"):
        rate = f"{summary['rollouts_per_second']:.2f} rollouts/s over {summary['wall_seconds']:.0f}s"
        rows.append(("throughput", rate))
    if summary.get("concurrency"):
        reached, asked = summary["concurrency"]["reached"], summary["concurrency"]["asked"]
        rows.append(("concurrency", f"{reached} at once at most (run.concurrency={asked})"))
    for node_id, limit in (summary.get("adaptive") or {}).items():
        rows.append(("adaptive limit", f"node {node_id[:8]} ended at {limit['limit']} (started at {limit['start']}, "
                                       f"at most {limit['capacity']}; {limit['changed']} changes)"))
    if summary.get("startup"):
        rows.append(("start-up", format_startup(summary["startup"])))
    if summary.get("report"):
        rows.append(("report", "  ".join(p for p in summary["report"].values() if p)))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def format_startup(startup: dict[str, Any]) -> str:
    """``6.1s to the first model call: ray 2.3, serve 1.9, workers 0.8 (side by side: serve, workers)``."""
    parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in startup.get("parts", {}).items())
    together = startup.get("side_by_side") or []
    return (f"{startup['seconds']:.1f}s to the first model call" + (f": {parts}" if parts else "")
            + (f" (side by side: {', '.join(together)})" if together else ""))


def _retried(latest: list[RolloutResult]) -> dict[str, Any]:
    """The attempts that ran again (every earlier attempt of a final result): how many, why, the seconds they had
    run, and per node (``{node_id: {"attempts", "seconds"}}``): what a lost machine cost."""
    earlier = [a for r in latest for a in r.attempts[:-1] if a.attempt < r.attempt]
    by_node: dict[str, dict[str, float]] = {}
    for a in earlier:
        if a.node_id:
            cost = by_node.setdefault(a.node_id, {"attempts": 0, "seconds": 0.0})
            cost["attempts"] += 1
            cost["seconds"] = round(cost["seconds"] + (a.seconds or 0.0), 3)
    return {"attempts": len(earlier), "seconds": round(sum(a.seconds or 0.0 for a in earlier), 3),
            "by_exit_reason": count_by(a.exit_reason.value for a in earlier), "by_node": by_node}


def _size(count: int) -> str:
    return f"{count / 1e6:.0f} MB" if count >= 1e6 else f"{count / 1e3:.0f} kB"


def _num_steps(r: RolloutResult) -> int:
    # A results.jsonl line (StoredResult) has no trajectory but remembers how many steps it had.
    return len(r.trajectory.steps) or (r.num_steps if isinstance(r, StoredResult) else 0)


def _first_messages(failed: list[RolloutResult]) -> dict[str, str]:
    """The first message of each error type (what a user needs to see why a run did nothing, not only counts)."""
    first: dict[str, str] = {}
    for r in failed:
        kind = r.error.type if r.error else "unknown"
        first.setdefault(kind, r.error.message if r.error else f"no error recorded ({r.exit_reason.value})")
    return first


def _one_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _mean(values: list[float] | list[bool]) -> float | None:
    return sum(values) / len(values) if values else None


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pairs(counts: dict[str, int]) -> str:
    return "  ".join(f"{k}={v}" for k, v in counts.items()) or "none"


def _types(counts: dict[str, int]) -> str:
    return f"  (types: {', '.join(f'{k}={v}' for k, v in counts.items())})" if counts else ""
