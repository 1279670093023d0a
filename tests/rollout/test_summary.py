"""Summary numbers on a hand-made set of results, pass@k worked out by hand, the progress line, and how it is
shown on a terminal (redrawn in place) and in a log (plain lines)."""

import io
import json
from math import isclose

import pytest

from rollout.errors import ExitReason
from rollout.records import ErrorInfo, RolloutResult, Step, Trajectory, Usage
from rollout.store.run_dir import RunStore
from rollout.store.summary import Progress, ProgressDisplay, format_progress, format_table, pass_at_k, summarize


def done(task, sample, reward, reason=ExitReason.SUBMITTED, steps=2, attempt=1):
    traj = Trajectory(steps=[Step(index=i + 1, message={"role": "assistant", "content": "x"}) for i in range(steps)])
    return RolloutResult(
        rollout_id=f"{task}#{sample}", task_id=task, sample_index=sample, attempt=attempt, status="completed",
        exit_reason=reason, reward=reward, trajectory=traj,
        usage=Usage(prompt_tokens=100, completion_tokens=10, total_tokens=110),
    )  # fmt: skip


def infra(task, sample, reason=ExitReason.MODEL_ERROR, error="ModelError", attempt=1, message="boom"):
    return RolloutResult(
        rollout_id=f"{task}#{sample}", task_id=task, sample_index=sample, attempt=attempt, status="infra_failed",
        exit_reason=reason, error=ErrorInfo(type=error, message=message),
    )  # fmt: skip


def hand_made():
    return [
        # A: 4 scored samples, 2 successes. Its first attempt at sample 0 failed and was retried.
        infra("A", 0, attempt=1),
        done("A", 0, 1.0, attempt=2),
        done("A", 1, 0.0, ExitReason.STEP_LIMIT, steps=6),
        done("A", 2, 1.0),
        done("A", 3, 0.0, ExitReason.STEP_LIMIT, steps=6),
        # B: 3 scored samples, no success; one sample lost to infrastructure.
        done("B", 0, 0.0),
        done("B", 1, 0.0),
        done("B", 2, 0.0),
        infra("B", 3, ExitReason.CONTAINER_START_FAILED, "ContainerStartError"),
        # C: never scored.
        infra("C", 0, attempt=1),
        infra("C", 0, attempt=2),
        infra("C", 1),
        # D: one sample, a success.
        done("D", 0, 1.0),
    ]


def test_summary_numbers_by_hand():
    s = summarize(hand_made(), k_values=(1, 2))
    assert s["rollouts"] == {"total": 11, "completed": 8, "infra_failed": 3}  # superseded attempts not counted
    assert s["tasks"] == {"total": 4, "scored": 3, "resolved": 2}
    assert s["reward_mean"] == 3 / 8  # infrastructure failures stay out of the mean
    # pass@1 per task: A 2/4, B 0/3, D 1/1 → mean 0.5.
    # pass@2: A 1 - C(2,2)/C(4,2) = 5/6, B 0, D has one sample so is left out → 5/12.
    assert isclose(s["pass_at_k"]["1"], 0.5) and isclose(s["pass_at_k"]["2"], 5 / 12)
    assert s["pass_at_k_tasks"] == {"1": 3, "2": 2}
    assert isclose(s["resolved_rate"], 2 / 3) and s["resolved_of_all"] == 0.5
    assert s["exit_reasons"] == {"submitted": 6, "step_limit": 2}
    assert s["infra_failures"] == {
        "by_exit_reason": {"model_error": 2, "container_start_failed": 1},
        "by_error_type": {"ModelError": 2, "ContainerStartError": 1},
        "first_message_by_error_type": {"ModelError": "boom", "ContainerStartError": "boom"},
    }
    assert s["steps_mean"] == (6 * 2 + 2 * 6) / 8
    assert s["tokens"]["total"] == 8 * 110 and s["tokens"]["completion"] == 80
    json.dumps(s)


def test_threshold_and_throughput_are_parameters():
    s = summarize([done("A", 0, 0.6), done("A", 1, 0.2)], success_threshold=0.5, wall_seconds=4.0, ran=1)
    assert s["pass_at_k"]["1"] == 0.5 and s["resolved_rate"] == 1.0
    assert s["rollouts_per_second"] == 0.25
    assert summarize([done("A", 0, 0.6)])["resolved_rate"] == 0.0


def test_pass_at_k_estimator_edges():
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert isclose(pass_at_k(10, 3, 1), 0.3)
    assert isclose(pass_at_k(10, 3, 5), 1 - 21 / 252)  # C(7,5)=21, C(10,5)=252
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_summary_of_results_loaded_back_from_disk_matches(tmp_path):
    store = RunStore(tmp_path).open({}, {})
    for r in hand_made():
        store.append(r)
    store.close()
    assert summarize(RunStore(tmp_path).load(), (1, 2)) == summarize(hand_made(), (1, 2))


def test_empty_summary_and_table_do_not_crash():
    s = summarize([])
    assert s["reward_mean"] is None and s["pass_at_k"] == {"1": None}
    assert "rollouts" in format_table(s)


def test_table_shows_counts_reward_pass_and_infra_apart():
    table = format_table(summarize(hand_made(), (1, 2), wall_seconds=10.0))

    def row(name):
        (line,) = [line for line in table.splitlines() if line.startswith(name + "  ")]
        return line[len(name) :].strip()

    assert row("rollouts") == "11  (completed 8, infra_failed 3)"
    assert row("reward mean") == "0.375"
    assert row("pass@1") == "0.500  over 3 tasks" and row("pass@2") == "0.417  over 2 tasks"
    assert row("exit reasons") == "submitted=6  step_limit=2"
    assert row("infra failures").startswith("model_error=2  container_start_failed=1")
    assert row("throughput") == "1.10 rollouts/s over 10s"


def test_progress_line_counts_rate_and_eta():
    now = [100.0]
    progress = Progress(total=40, already_done=2, clock=lambda: now[0])
    assert progress.line().startswith("2/40 done  0.0/s  ETA ?")
    for i in range(10):
        now[0] += 0.5
        progress.update(done("A", i, 1.0, ExitReason.STEP_LIMIT if i < 2 else ExitReason.SUBMITTED))
    progress.update(infra("B", 0))
    # 11 finished in 5 s → 2.2/s; 27 left → ETA 12 s.
    assert progress.line() == "13/40 done  2.2/s  ETA 12s  step_limit=2  submitted=8  infra=1"
    now[0] += 600
    # 11 in 605 s is slow: shown per minute; 27 left → ETA 1485 s.
    assert progress.line().startswith("13/40 done  1.1/min  ETA 24m45s")


def test_status_adds_in_flight_and_failures_by_type_and_line_stays_as_it_was():
    now = [0.0]
    progress = Progress(total=10, clock=lambda: now[0])
    now[0] += 2.0
    progress.update(done("A", 0, 1.0))
    progress.update(infra("B", 0, error="ModelError"))
    progress.update(infra("B", 1, ExitReason.CONTAINER_START_FAILED, "ContainerStartError"))
    progress.update(infra("C", 0, error="ModelError"))
    assert progress.line() == "4/10 done  2.0/s  ETA 3s  submitted=1  infra=3"
    assert progress.status(in_flight=5) == (
        "4/10 done  2.0/s  ETA 3s  in_flight=5  submitted=1  infra=3 (ModelError=2, ContainerStartError=1)")
    snap = progress.snapshot()
    assert (snap["done"], snap["total"], snap["ran"], snap["rate"], snap["eta_seconds"]) == (4, 10, 4, 2.0, 3.0)
    assert snap["outcomes"] == {"submitted": 1} and snap["infra_failed"] == 3
    assert snap["failures_by_type"] == {"ModelError": 2, "ContainerStartError": 1}
    # a snapshot read back from JSON (the live view) renders the same
    assert format_progress(json.loads(json.dumps(snap)), 5) == progress.status(in_flight=5)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_display_redraws_one_line_on_a_terminal():
    out = Terminal()
    display = ProgressDisplay(out, width=30)
    assert display.tty
    display.show("1/4 done  0.5/s  ETA 6s  in_flight=3  submitted=1  infra=0")
    display.show("2/4 done")
    display.end()
    display.end()  # twice is harmless
    # each redraw returns to the line start, is clipped to the width, and clears what a longer one left
    assert out.getvalue() == "\r1/4 done  0.5/s  ETA 6s  in_f\x1b[K\r2/4 done\x1b[K\n"


def test_display_writes_plain_lines_elsewhere():
    out = io.StringIO()
    display = ProgressDisplay(out)
    assert not display.tty
    display.show("1/4 done")
    display.show("2/4 done")
    display.end()
    assert out.getvalue() == "1/4 done\n2/4 done\n"
    forced = io.StringIO()
    ProgressDisplay(forced, tty=True, width=80).show("x")  # the caller may decide
    assert forced.getvalue() == "\rx\x1b[K"


def test_summary_and_table_give_the_first_message_of_each_error_type():
    results = [
        infra("A", 0, error="ModelError", message="POST http://x/v1/chat/completions: HTTP 503: down\nmore"),
        infra("A", 1, error="ModelError", message="a later message"),
        infra("B", 0, ExitReason.VERIFIER_ERROR, "VerifierError", message="task B has no data.answer"),
        done("C", 0, 1.0),
    ]
    summary = summarize(results)
    assert summary["infra_failures"]["first_message_by_error_type"] == {
        "ModelError": "POST http://x/v1/chat/completions: HTTP 503: down\nmore",
        "VerifierError": "task B has no data.answer",
    }
    table = format_table(summary)
    assert "ModelError: POST http://x/v1/chat/completions: HTTP 503: down" in table
    assert "VerifierError: task B has no data.answer" in table and "a later message" not in table
    assert "ModelError: POST http://x/v1/chat/completions: HTTP 503: down\nmore" not in table  # one line each


def test_the_start_up_split_is_kept_and_shown_as_one_row():
    startup = {"seconds": 6.14, "parts": {"ray": 2.31, "serve": 1.9, "workers": 0.8, "first container": 0.5},
               "side_by_side": ["serve", "workers"]}
    summary = summarize(hand_made(), wall_seconds=10.0, startup=startup)
    assert summary["startup"] == startup
    (row,) = [line for line in format_table(summary).splitlines() if line.startswith("start-up")]
    assert row.split("  ", 1)[1].strip() == ("6.1s to the first model call: ray 2.3, serve 1.9, workers 0.8, "
                                             "first container 0.5 (side by side: serve, workers)")
    quiet = summarize(hand_made(), wall_seconds=10.0)  # a run that made no model call: no row
    assert quiet["startup"] is None and "start-up" not in format_table(quiet)


def test_the_startup_clock_splits_the_seconds_before_the_first_model_call():
    from cluster.assembly.startup import FIRST_CALL, StartupClock, first_model_call

    clock = StartupClock(t0=100.0)
    clock.spans.update({"config": (100.0, 100.4), "ray": (100.4, 103.0), "images": (100.5, 101.0),
                        "serve": (103.0, 105.0), "workers": (103.1, 104.0), "unfinished": (104.0, None)})
    clock.spans[FIRST_CALL] = (105.0, None)
    first = done("A", 0, 1.0)
    first.trajectory.steps[0].started_at = 105.5
    later = done("A", 1, 1.0)
    later.trajectory.steps[0].started_at = 107.0
    assert first_model_call([later, first, done("B", 0, 0.0, steps=0)]) == 105.5
    split = clock.split(105.5)
    assert split["seconds"] == 5.5
    # in start order, each part's own seconds; a part never ended is left out
    assert list(split["parts"].items()) == [("config", 0.4), ("ray", 2.6), ("images", 0.5), ("serve", 2.0),
                                            ("workers", 0.9), (FIRST_CALL, 0.5)]
    assert split["side_by_side"] == ["ray", "images", "serve", "workers"]
    assert StartupClock().split(None) is None  # no model call, no split
