"""summary.png: six panels drawn with matplotlib (the ``report`` extra) from ``report_data.collect``: reward
distribution, rollout duration distribution, turns per rollout, outcomes, infrastructure failures by type, and
per task its successes (for SWE runs: resolved by instance). The panels' titles are in the PNG's text too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PANELS = ("reward distribution", "rollout duration distribution", "turns per rollout", "outcomes",
          "infrastructure failures by type", "per task")
SIZE = (15, 9)
"""Inches; at ``DPI``, 1500 x 900 pixels."""
DPI = 100
INSTALL_HINT = "pip install 'rollout-farm[report]' (matplotlib)"


class MatplotlibMissing(RuntimeError):
    def __init__(self) -> None:
        super().__init__(f"summary.png needs matplotlib, which is not installed: {INSTALL_HINT}")


def warm() -> None:
    """Import what ``write_png`` draws with (half a second of CPU here), e.g. on a thread while a run waits on its
    containers and model, so that the run's end does not wait for it; nothing when matplotlib is missing."""
    try:
        import matplotlib.backends.backend_agg  # noqa: F401 - the canvas savefig uses; the report extra, as below
        import matplotlib.figure  # noqa: F401 - the report extra
        import matplotlib.ticker  # noqa: F401 - the report extra
    except ImportError:
        pass


def write_png(data: dict[str, Any], path: Path) -> Path:
    """Draw ``data`` (``report_data.collect``) into ``path``; raises ``MatplotlibMissing`` without matplotlib."""
    try:
        from matplotlib.figure import Figure  # the report extra
    except ImportError:
        raise MatplotlibMissing() from None
    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    summary = data["summary"]
    mean = summary.get("reward_mean")
    fig.suptitle(f"run {data['run_id']}: {summary['rollouts']['total']} rollouts, "
                 f"reward mean {'-' if mean is None else f'{mean:.3f}'}", fontsize=14)
    _histogram(axes[0], data["rewards"], "reward", "#7c3aed")
    _histogram(axes[1], data["durations"], "seconds", "#2563eb")
    _histogram(axes[2], data["turns"], "turns", "#0d9488")
    _bars(axes[3], data["outcomes"], "#16a34a")
    _bars(axes[4], data["failures"], "#dc2626")
    _per_task(axes[5], data["per_task"])
    titles = [*PANELS[:5], data["per_task"]["title"]]
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=11)
    fig.savefig(path, format="png", metadata={"Title": f"rollout-farm run {data['run_id']}",
                                               "Description": "panels: " + "; ".join(titles)})
    return path


def _histogram(ax: Any, hist: dict[str, Any], unit: str, color: str) -> None:
    if not hist["n"]:
        return _empty(ax, "no completed rollouts")
    if len(hist["counts"]) == 1:  # one value: one bar named by it, not a bin over a range made up around it
        ax.bar([0], hist["counts"], width=0.5, color=color)
        ax.set_xticks([0], [f"{hist['centers'][0]:.4g}"])
        ax.set_xlim(-1.5, 1.5)
    else:
        ax.bar(hist["centers"], hist["counts"], width=hist["width"] * 0.9, color=color)
    ax.set_xlabel(f"{unit}  (n={hist['n']}, mean {hist['mean']:.3g})")
    ax.set_ylabel("rollouts")
    _whole_numbers(ax.yaxis)


def _bars(ax: Any, counts: dict[str, int], color: str) -> None:
    if not counts:
        return _empty(ax, "none")
    names = list(counts)[::-1]
    ax.barh(names, [counts[n] for n in names], color=color, height=0.7)
    if len(names) < 4:  # a bar or two as thick as one of four, centred
        extra = (4 - len(names)) / 2
        ax.set_ylim(-0.5 - extra, len(names) - 0.5 + extra)
    ax.set_xlabel("rollouts")
    ax.tick_params(axis="y", labelsize=8)
    _whole_numbers(ax.xaxis)


def _per_task(ax: Any, per_task: dict[str, Any]) -> None:
    tasks = per_task["tasks"]
    if not tasks:
        return _empty(ax, "no results")
    y = list(range(len(tasks)))[::-1]
    ax.barh(y, per_task["samples"], color="#e5e7eb", label="samples")
    ax.barh(y, per_task["wins"], color="#16a34a", label="resolved" if "resolved" in per_task["title"] else "successes")
    ax.set_yticks(y, [t[:32] for t in tasks], fontsize=max(5, 9 - len(tasks) // 10))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncols=2, fontsize=8, frameon=False)
    _whole_numbers(ax.xaxis)
    if per_task["hidden"]:
        ax.set_title(f"(the first {len(tasks)} tasks by id; {per_task['hidden']} more not shown)", loc="right",
                     fontsize=8)


def _whole_numbers(axis: Any) -> None:
    from matplotlib.ticker import MaxNLocator  # the report extra

    axis.set_major_locator(MaxNLocator(integer=True))


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=12, color="#6b7280", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
