"""SkyRL's generator batch in farm terms, and the farm's results back in the shape of SkyRL's ``GeneratorOutput``
(skyrl 0.3.0, ``skyrl.train.generators.base``), as plain data: nothing here imports skyrl, so it is tested in our own
venv; ``examples/skyrl_generator.py`` is the ``GeneratorInterface`` that calls it with SkyRL's own types.

In: one row per trajectory, as SkyRL's ``prepare_generator_input`` flattens a batch (each prompt repeated
``n_samples_per_prompt`` times). A row's ``TrajectoryID`` (instance, repetition) is a farm member: the instance is
the task (its id) and the group, the repetition its sample index, so a group's members get the farm's per-sample seeds
and rewards. A row's prompt (a conversation) is the task's opening: one user message is the task's ``prompt`` (the
agent adds its own system prompt and template, as for a dataset row), a longer conversation its ``messages``, used as
they are. Its ``env_extras`` are the rest of the task's row (``data``, ``check``, ...); its env class picks the farm's
profile of that name, else the farm's top-level environment. SkyRL's sampling parameters (vLLM's, built by
``get_vllm_sampling_params``) become the call's ``sampling``.

Out: one row per input row, in input order. A completed member gives its first token segment
(``rollout.train.tokens``): the first turn's prompt ids, every later token as the response, the loss mask 1 on the
engine's own tokens, the engine's logprobs (0.0 where masked), the farm's reward. A member that failed or went stale
gives a placeholder SkyRL can batch (its first prompt's ids, or ``[pad_id]``; a response of ``[pad_id]``, mask 0,
reward 0.0), and its exit reason (or ``stale``, ``not_started``) as its stop reason. Stop reasons are otherwise the
engine's vocabulary, as SkyRL's overlong filter reads them: ``stop`` for a last turn the engine ended itself (vLLM's
chat server says ``tool_calls`` for one that ended in a tool call), ``length`` for one cut by ``max_tokens``, or a
rollout cut by its token budget; the farm's own exit reasons are counted in ``rollout_metrics``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from cluster.farm.tasks import SAMPLING_KEYS
from rollout.data.dataset import task_from_row
from rollout.errors import ExitReason
from rollout.records import RolloutResult, Task
from rollout.train.batch import usable
from rollout.train.tokens import has_token_data, segments

GENERATOR_OUTPUT_KEYS = ("prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons", "rollout_metrics",
                         "rollout_logprobs", "trajectory_ids", "trajectory_generation_times", "rollout_expert_indices",
                         "is_last_step", "env_metrics", "pixel_values", "image_grid_thw")
"""Every key of skyrl 0.3.0's ``GeneratorOutput`` (a total TypedDict: all present, ``None`` where not carried)."""
RENAMED_SAMPLING = {"max_generate_length": "max_tokens"}
"""SkyRL's own names (its config's ``SamplingParams``) for the farm's."""
ENGINE_SET_SAMPLING = frozenset({"skip_special_tokens", "include_stop_str_in_output", "logprobs", "additional_kwargs"})
"""vLLM options SkyRL always sends that the farm's model section decides instead: detokenization (the ids are what is
trained) and whether logprobs come back (``model.logprobs``; SkyRL's ``logprobs: 0`` means the sampled token's)."""


@dataclass
class FarmCall:
    """One ``generate`` call: tasks that each want ``n`` samples."""

    tasks: list[Task]
    n: int


@dataclass
class SkyrlPlan:
    """A SkyRL batch as farm calls, and where each input row's member is."""

    calls: list[FarmCall]
    rows: list[tuple[str, int]]
    """Per input row: (task id, sample index)."""
    env_classes: list[str]
    sampling: dict[str, Any]
    seed: int | None = None
    """SkyRL's ``seed`` sampling parameter: the call's base seed (member i gets seed + i), never one seed for all."""
    set_aside: list[str] = field(default_factory=list)
    """Sampling keys the farm's model section decides instead (``ENGINE_SET_SAMPLING``)."""


def farm_sampling(params: Mapping[str, Any] | None) -> tuple[dict[str, Any], int | None, list[str]]:
    """(the call's ``sampling``, its base seed, the keys set aside) from SkyRL's sampling parameters. ``None`` values
    are left out (the model section's apply); a key the farm does not know fails here, naming it."""
    sampling, seed, aside = {}, None, []
    for key, value in (params or {}).items():
        key = RENAMED_SAMPLING.get(key, key)
        if key in ENGINE_SET_SAMPLING:
            aside.append(key)
        elif key == "seed":
            seed = value
        elif key not in SAMPLING_KEYS:
            raise ValueError(f"sampling_params: {key!r} is not a sampling parameter the farm sends to its model "
                             f"(known: {', '.join(sorted(SAMPLING_KEYS | set(RENAMED_SAMPLING)))})")
        elif value is not None:
            sampling[key] = list(value) if key == "stop" else value
    return sampling, seed, sorted(aside)


def opening(prompt: Any) -> dict[str, Any]:
    """A SkyRL prompt (a conversation, or a text) as a task row's ``prompt`` or ``messages``."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    messages = [dict(m) for m in prompt]
    if len(messages) == 1 and messages[0].get("role") == "user" and isinstance(messages[0].get("content"), str):
        return {"prompt": messages[0]["content"]}
    return {"messages": messages}


def plan_batch(prompts: Sequence[Any], env_classes: Sequence[str], env_extras: Sequence[Mapping | None] | None,
               sampling_params: Mapping[str, Any] | None, trajectory_ids: Sequence[tuple[str, int]] | None,
               profiles: Iterable[str | None] = ()) -> SkyrlPlan:
    """SkyRL's input batch (``trajectory_ids`` as (instance id, repetition) pairs; without them each row is a task of
    its own, ``row-<i>``) as farm calls: one per group size, its tasks in first-seen order. A task's id is its
    instance id (a ``task_id`` in the extras is not used: the instance is the group SkyRL computes advantages over),
    and its opening is SkyRL's prompt."""
    if len(env_classes) != len(prompts) or (env_extras is not None and len(env_extras) != len(prompts)):
        raise ValueError(f"{len(prompts)} prompts, {len(env_classes)} env classes, "
                         f"{'no' if env_extras is None else len(env_extras)} env extras: one of each per row")
    ids = list(trajectory_ids) if trajectory_ids is not None else [(f"row-{i}", 0) for i in range(len(prompts))]
    if len(ids) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(ids)} trajectory ids")
    known = {p for p in profiles if p is not None}
    tasks: dict[str, Task] = {}
    samples: dict[str, set[int]] = {}
    for i, (instance, repetition) in enumerate(ids):
        samples.setdefault(instance, set())
        if repetition in samples[instance]:
            raise ValueError(f"trajectory {instance}_{repetition} appears twice")
        samples[instance].add(repetition)
        if instance in tasks:
            continue  # SkyRL repeats the row for every sample: the first one is the task
        extras = {k: v for k, v in dict((env_extras or [None] * len(prompts))[i] or {}).items() if k != "task_id"}
        row = {**extras, "task_id": instance, **opening(prompts[i])}
        task = task_from_row(row, f"env_extras[{i}]")
        meta = {**task.metadata, "skyrl_env_class": env_classes[i]}
        data = {**task.data, "profile": env_classes[i]} if env_classes[i] in known else task.data
        tasks[instance] = task.model_copy(update={"metadata": meta, "data": data})
    calls: dict[int, FarmCall] = {}
    for instance, reps in samples.items():
        if reps != set(range(len(reps))):
            raise ValueError(f"instance {instance!r}: repetitions {sorted(reps)}, not 0..{len(reps) - 1}")
        calls.setdefault(len(reps), FarmCall([], len(reps))).tasks.append(tasks[instance])
    sampling, seed, aside = farm_sampling(sampling_params)
    return SkyrlPlan(calls=list(calls.values()), rows=ids, env_classes=list(env_classes), sampling=sampling,
                     seed=seed, set_aside=aside)


def stop_reason(result: RolloutResult) -> str:
    """The engine's word for how the trajectory ended (see the module's docstring)."""
    steps = result.trajectory.steps
    finish = steps[-1].finish_reason if steps else None
    if result.exit_reason == ExitReason.TOKEN_LIMIT or finish == "length":
        return "length"
    return "stop" if finish in ("stop", "tool_calls") else (finish or result.exit_reason.value)


def generator_output(plan: SkyrlPlan, results: Mapping[tuple[str, int], RolloutResult],
                     pad_id: int = 0) -> dict[str, Any]:
    """A ``GeneratorOutput``-shaped dict of the plan's rows from the farm's results by (task id, sample index);
    ``trajectory_ids`` is left for the caller to fill with SkyRL's own objects."""
    out: dict[str, Any] = {key: None for key in GENERATOR_OUTPUT_KEYS}
    prompts, responses, masks, logprobs, rewards, stops, times, env = [], [], [], [], [], [], [], []
    left_out = 0
    for key in plan.rows:
        r = results.get(key)
        steps = r.trajectory.steps if r is not None else []
        if r is not None and usable(r) and has_token_data(steps):
            first, *rest = segments(steps)
            left_out += len(rest)
            prompts.append(first.prompt_ids)
            responses.append(first.response_ids)
            masks.append(first.loss_mask)
            logprobs.append(first.logprobs)
            rewards.append(float(r.reward or 0.0))
            stops.append(stop_reason(r))
        else:  # nothing to train on: a row SkyRL can still batch
            prompts.append(list(steps[0].prompt_token_ids or []) if steps and steps[0].prompt_token_ids else [pad_id])
            responses.append([pad_id])
            masks.append([0])
            logprobs.append([0.0])
            rewards.append(0.0)
            stops.append("not_started" if r is None else "stale" if r.metadata.get("stale") else r.exit_reason.value)
        times.append(float(r.timings.get("total", 0.0)) if r is not None else 0.0)
        env.append({"num_turns": len(steps), "trained": int(sum(masks[-1]) > 0), "reward": rewards[-1]})
    got = [results[key] for key in plan.rows if key in results]
    exits = Counter(r.exit_reason.value for r in got)
    out.update(prompt_token_ids=prompts, response_ids=responses, loss_masks=masks, rollout_logprobs=logprobs,
               rewards=rewards, stop_reasons=stops, trajectory_generation_times=times, env_metrics=env)
    out["rollout_metrics"] = {
        "farm/rollouts": len(plan.rows), "farm/trained": sum(e["trained"] for e in env),
        "farm/failed": sum(r.status != "completed" for r in got), "farm/not_started": len(plan.rows) - len(got),
        "farm/stale": sum(bool(r.metadata.get("stale")) for r in got),
        "farm/segments_left_out": left_out,
        **{f"farm/exit_reason/{reason}": count for reason, count in sorted(exits.items())}}
    return out


def results_by_member(batches: Iterable[Any]) -> dict[tuple[str, int], RolloutResult]:
    """The members of the farm's batches (kept and dropped groups) by (task id, sample index)."""
    return {(r.task_id, r.sample_index): r for batch in batches for r in batch.results}
