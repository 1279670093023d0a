"""The parts of the CPU RL example (``examples/rl_cpu``): the tool task family and its reward, the token-in
rendering of the warm start's trajectories, the GRPO math, and the saved model. Seconds, on a one-layer model;
the torch parts need the ``cpu-llm`` extra (skip without it, fail with ROLLOUT_REQUIRE_VLLM=1 as in CI)."""

from __future__ import annotations

import asyncio
import os
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # examples/ is not an installed package: plain `pytest` does not put the root on the path
    sys.path.insert(0, ROOT)

from agents.tool_agent import ToolCallingAgent, ToolCallingAgentConfig
from envs.tool_env import ToolEnvironment, ToolEnvironmentConfig
from examples.rl_cpu import tasks as T
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta
from rollout.runner import run_rollout
from rollout.train.batch import TrainerSample


def call(name, **arguments):
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def play(row, outputs, max_steps=4):
    """One rollout of ``row`` by a scripted model, through the run config's dotted paths."""
    env = ToolEnvironment.from_config(ToolEnvironmentConfig(tools="examples.rl_cpu.tasks:tools_for",
                                                            reward="examples.rl_cpu.tasks:reward"))
    agent = ToolCallingAgent(ToolCallingAgentConfig(max_steps=max_steps))
    task = T.as_task(row)
    return asyncio.run(run_rollout(task, agent, ScriptedModel(outputs), env, verifier=env, limits=agent.limits(),
                                   meta=RequestMeta(rollout_id="r1", task_id=task.task_id)))


ADD = {"task_id": "t-add", "prompt": "What is 3 + 4?",
       "data": {"answer": 7, "level": 1, "solution": [["calculator", {"a": 3, "op": "+", "b": 4}]]}}


def test_the_splits_are_disjoint_and_every_row_is_where_its_problem_hashes():
    rows = {split: T.make_tasks(400, seed, split) for seed in (0, 1) for split in T.SPLITS}
    train = {T.problem_key(r) for seed in (0, 1) for r in T.make_tasks(400, seed, "train")}
    held = {T.problem_key(r) for seed in (0, 1) for r in T.make_tasks(400, seed, "heldout")}
    assert train and held and not train & held
    assert all(r["data"]["split"] == split and T.split_of(T.problem_key(r)) == split for split in rows
               for r in rows[split])
    assert {r["data"]["level"] for r in rows["train"]} == set(T.LEVELS)
    assert len({r["task_id"] for r in rows["train"]}) == 400


def test_a_solved_task_scores_one_through_the_dotted_paths_and_the_tools_answer():
    result = play(ADD, [call("calculator", a=3, op="+", b=4), "The answer is 7."])
    assert result.reward == 1.0 and result.trajectory.messages[2]["content"] == "7"
    row = T.make_tasks(4, 0, "train")[3]
    assert row["data"]["level"] == 4
    (_, lookup), (_, mul) = row["data"]["solution"]
    result = play(row, [call("lookup", **lookup), call("calculator", **mul), f"It costs {row['data']['answer']}."])
    assert result.reward == 1.0 and result.summary.num_tool_calls == 2


@pytest.mark.parametrize("outputs, expected", [
    ([call("calculator", a=3, op="+", b=4)] * 2, 0.0),  # the answer only in a tool's output: the steps ran out
    ([call("calculator", a=7, op="+", b=0)] * 2, 0.0),  # only in a call's arguments
    (['<tool_call>\n{"name": "calculator", "arguments": {"a": 7}}\n</tool_call>'], 0.0),  # call text, unparsed
    (['The answer is <tool_call>{"name": "calculator", "arguments": {"a": 7, "b": 0}}'], 0.0),  # cut off
    (['It is 7. <tool_call>{"name": "calculator", "arguments": {"a": 8}}</tool_call>'], 1.0),
    (["3 + 4 = 7, or maybe 8"], 0.0),
    (["It is 7, I checked 3 + 4"], 0.0),
    (["3 + 4 = 7"], 1.0),
    (["seven"], 0.0),
    (["The answer is -7."], 0.0),
    (["The answer is 77."], 0.0),
])
def test_the_reward_reads_only_the_last_number_of_the_final_answer(outputs, expected):
    assert play(ADD, outputs, max_steps=2).reward == expected


# ---- torch parts ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack():
    try:
        import torch
        import transformers  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        if os.environ.get("ROLLOUT_REQUIRE_VLLM", "") not in ("", "0", "false", "no"):
            pytest.fail(f"ROLLOUT_REQUIRE_VLLM is set but torch/transformers do not import: {exc}")
        pytest.skip("torch/transformers are not installed (the cpu-llm extra)")
    from examples.rl_cpu import warm_start as W

    torch.set_num_threads(2)
    tok = W.build_tokenizer(0)
    model = W.build_model(tok, seed=0, hidden=64, layers=1, intermediate=128)
    rng, tools = random.Random(0), T.tool_schemas()
    W.sft(model, [W.encode(tok, W.trajectory(row, rng), tools) for row in T.make_tasks(16, 0, "train")],
          steps=10, batch=4, lr=1e-2)  # a few steps: peaked enough that a wrong token costs whole nats
    return W, tok, model


def test_the_sft_stream_is_the_template_rendering_with_the_model_tokens_masked_in(stack):
    W, tok, _ = stack
    tools, rng = T.tool_schemas(), random.Random(0)
    eos, newline = W.end_of_turn(tok)
    assert tok.convert_ids_to_tokens([eos]) == ["<|im_end|>"]
    for row in T.make_tasks(8, 0, "train"):
        messages = W.trajectory(row, rng, guess=0.5)
        ids, mask = W.encode(tok, messages, tools)
        assert ids == W.render(tok, messages, tools, False)[:-1]  # the stream is the whole conversation's ids
        runs = [ids[i: j] for i, j in _runs(mask)]
        assert len(runs) == sum(m["role"] == "assistant" for m in messages)
        for (i, j), run in zip(_runs(mask), runs):
            assert run[-1] == eos and eos not in run[:-1]  # every completion ends the turn, once
            assert j == len(ids) or ids[j] == newline  # the template's "\n" after it is not the model's
        texts = [tok.decode(run, skip_special_tokens=True) for run in runs]
        assert texts[-1] == f"The answer is {row['data']['answer']}." or not texts[-1].startswith("<tool_call>")
        assert all("<tool_call>" in t for t in texts[:-1])  # the tool tags survive skip_special_tokens


def _runs(mask):
    out, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def _samples(W, tok, model, n=3, advantage=1.0):
    """Trainer samples of SFT trajectories, with the model's own logprobs as the engine's."""
    from examples.rl_cpu.grpo import token_logprobs

    tools, rng, out = T.tool_schemas(), random.Random(1), []
    for k, row in enumerate(T.make_tasks(n, 1, "train")):
        ids, mask = W.encode(tok, W.trajectory(row, rng), tools)
        first = mask.index(1)
        prompt, response, mask = ids[:first], ids[first:], mask[first:]
        lp = token_logprobs(model, prompt, response).tolist()
        out.append(TrainerSample(rollout_id=f"r{k}", task_id=row["task_id"], group_id="g", sample_index=k,
                                 segment=0, prompt_ids=prompt, response_ids=response, loss_mask=mask,
                                 logprobs=[x if m else 0.0 for x, m in zip(lp, mask)],
                                 policy_versions=[None] * len(response), reward=1.0,
                                 advantage=advantage * (1 if k % 2 else -1)))
    return out


def test_token_logprobs_are_a_plain_forward_pass_and_agree_with_themselves_batched(stack):
    import torch

    from examples.rl_cpu.grpo import logprob_agreement, token_logprobs

    W, tok, model = stack
    prompt, response = [5, 9, 13, 40, 41], [60, 7, 8, 2]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
        plain = torch.log_softmax(logits.float(), -1)[torch.arange(4, 8), torch.tensor(response)]
        got = token_logprobs(model, prompt, response)
    assert got.shape == (4,) and torch.allclose(got, plain, atol=1e-6)
    samples = _samples(W, tok, model)
    agree = logprob_agreement(model, samples)
    assert agree["tokens"] == sum(sum(s.loss_mask) for s in samples) and agree["max_abs"] < 1e-5
    shifted = [replace(s, response_ids=s.response_ids[1:] + [s.response_ids[0]]) for s in samples]
    assert logprob_agreement(model, shifted)["mean_abs"] > 0.5  # one token off shows: tenths of nats or more


def test_grpo_moves_the_weights_and_zero_advantage_gives_zero_loss(stack):
    import torch

    from examples.rl_cpu.grpo import grpo_loss, train_step

    W, tok, model = stack
    model = W.build_model(tok, seed=1, hidden=64, layers=1, intermediate=128)
    flat = [replace(s, advantage=0.0) for s in _samples(W, tok, model)]
    loss, stats = grpo_loss(model, flat)
    assert abs(stats["loss"]) < 1e-6 and abs(stats["ratio"] - 1) < 1e-5 and stats["clip_fraction"] == 0
    loss.backward()
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in model.parameters())
    model.zero_grad()
    samples = _samples(W, tok, model)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stats = train_step(model, optimizer, samples, micro_batch=2)  # two micro-batches of one batch
    assert stats["tokens"] == sum(sum(s.loss_mask) for s in samples) and abs(stats["ratio"] - 1) < 1e-5
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    _, after = grpo_loss(model, samples)
    assert after["ratio"] != 1.0 and after["kl"] != 0.0  # the policy moved away from the samples' one


def test_a_few_sft_steps_lower_the_loss_and_the_saved_model_reloads(stack, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.rl_cpu.grpo import save

    W, tok, _ = stack
    model = W.build_model(tok, seed=2, hidden=64, layers=1, intermediate=128)
    rng, tools = random.Random(0), T.tool_schemas()
    data = [W.encode(tok, W.trajectory(row, rng), tools) for row in T.make_tasks(16, 0, "train")]
    ids = torch.tensor([data[0][0]])
    mask = torch.tensor(data[0][1][1:], dtype=torch.float32)
    with torch.no_grad():  # the shared-prefix loss is the plain one
        nll = torch.nn.functional.cross_entropy(model(input_ids=ids).logits[0, :-1], ids[0, 1:], reduction="none")
        assert abs(W.sft_loss(model, data[:1]).item() - ((nll * mask).sum() / mask.sum()).item()) < 1e-5
    curve = W.sft(model, data, steps=6, batch=4, lr=3e-3)
    assert curve[-1][1] < curve[0][1]
    save(model, tok, tmp_path)
    again, tok2 = AutoModelForCausalLM.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, again(input_ids=ids).logits, atol=1e-5)
    assert tok2.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tools=tools,
                                    add_generation_prompt=True, tokenize=False) == \
        tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tools=tools,
                                add_generation_prompt=True, tokenize=False)
    assert tok2.eos_token == "<|im_end|>" and "<tool_call>" in tok2.decode(tok2.encode("<tool_call>x"),
                                                                           skip_special_tokens=True)


class ScriptedPolicy:
    """Stands in for the transformers model in ``evaluate``: answers every prompt of a batch with its question's next
    scripted text (then ``<|im_end|>``), and keeps each batch's prompts (left padding removed)."""

    def __init__(self, tok, script):
        self.tok, self.script, self.batches = tok, script, []

    def generate(self, input_ids, attention_mask, eos_token_id, pad_token_id, **_):
        import torch

        prompts = [[t for t, m in zip(ids, mask) if m] for ids, mask in zip(input_ids.tolist(),
                                                                             attention_mask.tolist())]
        self.batches.append(prompts)
        replies = []
        for prompt in prompts:
            text = self.tok.decode(prompt)
            question = next(q for q in self.script if q in text)
            turn = text.count("<|im_start|>assistant") - 1
            replies.append(self.tok.encode(self.script[question][turn], add_special_tokens=False) + [eos_token_id])
        width = max(len(r) for r in replies)
        return torch.tensor([p + r + [pad_token_id] * (width - len(r)) for p, r in zip(input_ids.tolist(), replies)])


def test_the_evaluation_steps_the_farms_agent_batching_the_model_calls_of_its_episodes(stack):
    """The RL example's evaluation is caller-driven stepping of the tool-calling agent: one generation per turn for
    every episode still going, each episode's next prompt its token-in stream (the completion's own ids kept)."""
    from examples.rl_cpu.evaluate import evaluate

    W, tok, _ = stack
    call = '<tool_call>\n{"name": "calculator", "arguments": {"a": 3, "op": "+", "b": 4}}\n</tool_call>'
    rows = [ADD, {**ADD, "task_id": "t-guess", "prompt": "What is 3 + 5?", "data": {**ADD["data"], "answer": 8}},
            {**ADD, "task_id": "t-loop", "prompt": "What is 3 + 6?", "data": {**ADD["data"], "answer": 9}}]
    policy = ScriptedPolicy(tok, {"3 + 4": [call, "The answer is 7."], "3 + 5": ["The answer is 9."],
                                  "3 + 6": [call, call, call]})
    report = evaluate(policy, tok, rows, greedy=True, max_turns=2)
    assert report["success"] == 1 / 3 and report["tool_use"] == 2 / 3 and report["n"] == 3
    assert [len(b) for b in policy.batches] == [3, 2]  # the direct answer ended its episode after one turn
    (first, _, loop1), (second, loop2) = policy.batches
    assert first == W.render(tok, [{"role": "user", "content": ADD["prompt"]}], T.tool_schemas(), True)
    completion = tok.encode(call, add_special_tokens=False) + [tok.eos_token_id]
    assert second[: len(first) + len(completion)] == first + completion  # never decoded and re-encoded
    assert tok.decode(second[len(first) + len(completion):]).endswith(
        "<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert loop2[: len(loop1)] == loop1  # two turns were all it had (max_turns): its answer never came


def test_the_local_evaluation_plays_whole_episodes_and_scores_them(stack):
    W, tok, model = stack
    rows = T.make_tasks(4, 2, "heldout")
    for greedy in (True, False):
        report = W.evaluate(model, tok, rows, greedy=greedy, max_turns=2, max_new_tokens=24)
        assert report["n"] == 4 and 0.0 <= report["success"] <= 1.0 and set(report["by_level"]) == set(T.LEVELS)


def test_a_step_not_evaluated_prints_and_plots_without_a_held_out_number(tmp_path):
    """``--eval-every``: a step without the held-out split says so on its line; the curve has the measured ones."""
    from examples.rl_cpu.report import format_row, plot

    row = {"step": 0, "version": "0", "next_version": "1", "train_reward": 0.25, "tokens_per_s": 700.0,
           "generate_s": 5.0, "train_s": 3.0, "reload_s": 0.1, "versions": {"0": 90}, "model_tokens": 90}
    line = format_row(row)
    assert "held-out   -  (not this step)" in line and "eval" not in line and "tokens by version" not in line
    measured = {**row, "step": 1, "heldout": 0.75, "heldout_greedy": 0.5, "eval_s": 12.0, "heldout_by_level": {1: 1.0}}
    assert "held-out 0.750 (greedy 0.500; L1 1.00)" in format_row(measured) and "eval 12.0s" in format_row(measured)
    pytest.importorskip("matplotlib")
    assert plot([row, measured], {"heldout": 0.5, "heldout_greedy": 0.0}, tmp_path / "r.png").stat().st_size > 1000


def test_the_staleness_histogram_counts_trained_tokens_by_versions_behind():
    from examples.rl_cpu.loop import Loop

    loop = Loop(served=None, farm=None, model=None, tokenizer=None, optimizer=None, out_dir=Path("."), heldout=[])
    loop.history = [{"version": "0", "versions": {"0": 10}}, {"version": "1", "versions": {"0": 7, "1": 5}},
                    {"version": "2", "versions": {"1": 4, "2": 6, "none": 3}}]
    assert loop.staleness() == {0: 21, 1: 11}  # a turn sampled before any version was set is not counted


def test_the_cpu_clock_reads_a_share_and_a_core_split_leaves_ray_at_least_one():
    from examples.rl_cpu.cores import CpuClock, split_cores

    clock = CpuClock().start()
    sum(i * i for i in range(200_000))  # some work, so the kernel's tick counters move
    share = clock.share()
    assert share is None or 0.0 <= share <= 1.0
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(SystemExit, match="leave Ray at least one"):
        split_cores(cores)
    if cores >= 2:
        trainer, ray = split_cores(1)
        assert len(trainer) == 1 and trainer.isdisjoint(ray) and len(ray) == cores - 1
