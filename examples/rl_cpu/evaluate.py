"""How often a warm-started policy solves its tasks: episodes of the farm's own agent and environment (the
tool-calling agent, ``max_turns`` model turns, the task's tools), stepped by this module, which owns generation
(``ToolCallingAgent().session(...)``: caller-driven stepping). Each turn the model calls of every episode still going
are one batch of sampled or greedy generation with transformers, each prompt the token-in stream the engine would see
(``examples.rl_cpu.rendering``); each conversation is graded by the task's reward."""

from __future__ import annotations

import asyncio
from typing import Any

from agents.tool_agent import ToolCallingAgent, ToolCallingAgentConfig
from envs.tool_env import ToolEnvironment
from examples.rl_cpu import tasks as T
from examples.rl_cpu.rendering import delta, render
from rollout.loop import Episode
from rollout.models.client.token_in import assistant_message
from rollout.protocols import ModelResponse
from rollout.records import Message


def generate(model, prompts: list[list[int]], greedy: bool, max_new_tokens: int, eos: int,
             pad: int) -> list[list[int]]:
    """Completions of left-padded prompts, through ``<|im_end|>`` when the model ends the turn (full
    distribution when sampling: temperature 1, no top-k or top-p, as the farm samples)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
        out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens, eos_token_id=eos,
                             pad_token_id=pad, **sampling)
    completions = []
    for row in out[:, width:].tolist():
        completions.append(row[: row.index(eos) + 1] if eos in row else row)
    return completions


def evaluate(model, tok, rows: list[dict[str, Any]], greedy: bool = False, max_turns: int = 4,
             max_new_tokens: int = 64, batch: int = 64, seed: int = 0) -> dict[str, Any]:
    """Play each row once, ``batch`` episodes at a time, and score it: ``{"success", "n", "by_level", "tool_use"}``
    (``tool_use``: the share of episodes that called a tool)."""
    import torch

    torch.manual_seed(seed)
    scores, used = [], []
    for start in range(0, len(rows), batch):
        chunk = rows[start: start + batch]
        conversations = asyncio.run(play(model, tok, chunk, greedy, max_turns, max_new_tokens))
        for row, conv in zip(chunk, conversations):
            scores.append((row["data"]["level"], T.score(row, conv)))
            used.append(any(m.get("tool_calls") for m in conv))
    levels = sorted({lv for lv, _ in scores})
    return {"success": sum(s for _, s in scores) / max(1, len(scores)), "n": len(scores),
            "by_level": {lv: sum(s for v, s in scores if v == lv) / sum(1 for v, _ in scores if v == lv)
                         for lv in levels},
            "tool_use": sum(used) / max(1, len(used))}


async def play(model, tok, rows: list[dict[str, Any]], greedy: bool, max_turns: int,
               max_new_tokens: int) -> list[list[Message]]:
    """The rows' episodes, stepped together until each is over; their conversations."""
    agent = ToolCallingAgent(ToolCallingAgentConfig(max_steps=max_turns))  # the farm's agent (no system prompt)
    episodes = [agent.session(ToolEnvironment(T.tools_for)) for _ in rows]
    await asyncio.gather(*(e.reset(T.as_task(row)) for e, row in zip(episodes, rows)))
    streams = [_Stream() for _ in rows]
    try:
        while live := [i for i, e in enumerate(episodes) if e.should_continue()]:
            prompts = [streams[i].prompt(tok, episodes[i]) for i in live]
            outs = generate(model, prompts, greedy, max_new_tokens, tok.eos_token_id, tok.pad_token_id)
            replies = [streams[i].reply(tok, completion) for i, completion in zip(live, outs)]
            await asyncio.gather(*(episodes[i].step(reply) for i, reply in zip(live, replies)))
    finally:
        await asyncio.gather(*(e.env.close() for e in episodes))
    return [list(e.ctx.messages) for e in episodes]


class _Stream:
    """One episode's token-in stream: turn 1's prompt rendered with the tools; turn k's, turn k-1's prompt and
    completion, then the rest of the end of turn and the messages added since (``rendering.delta``)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.messages: list[Message] = []
        """The conversation the ids hold: the last prompt's messages and the reply."""
        self.tools: list | None = None

    def prompt(self, tok, episode: Episode) -> list[int]:
        request = episode.request()
        if not self.messages:
            self.ids = render(tok, request.messages, request.tools, True)
        else:
            self.ids = self.ids + delta(tok, self.messages, request.messages, request.tools)
        self.messages, self.tools = request.messages, request.tools
        return self.ids

    def reply(self, tok, completion: list[int]) -> ModelResponse:
        """The completion as the client reads it: hermes tool calls parsed out; cut short without ``<|im_end|>``."""
        message = assistant_message(tok.decode(completion, skip_special_tokens=True), self.tools is not None)
        prompt, self.ids = self.ids, self.ids + completion
        self.messages = self.messages + [message]
        stopped = completion[-1:] == [tok.eos_token_id]
        return ModelResponse(message=message, finish_reason="stop" if stopped else "length",
                             prompt_token_ids=prompt, completion_token_ids=completion)
