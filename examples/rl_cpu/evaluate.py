"""How often a warm-started policy solves its tasks: sampled or greedy generation with transformers, episode by
episode through the same rendering the engine sees (``examples.rl_cpu.rendering``), graded by the task's reward."""

from __future__ import annotations

import json
from typing import Any

from examples.rl_cpu import tasks as T
from examples.rl_cpu.rendering import delta, render


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
    """Play each row once the way the tool-calling agent does (token-in streams, hermes parsing, the task's
    tools, ``max_turns`` model turns) and score it: ``{"success", "n", "by_level", "tool_use"}``."""
    import torch

    from rollout.models.client.token_in import assistant_message

    torch.manual_seed(seed)
    tools = T.tool_schemas()
    scores, used = [], []
    for start in range(0, len(rows), batch):
        chunk = rows[start: start + batch]
        convs = [[{"role": "user", "content": r["prompt"]}] for r in chunk]
        streams = [render(tok, c, tools, True) for c in convs]
        live = list(range(len(chunk)))
        for _turn in range(max_turns):
            if not live:
                break
            outs = generate(model, [streams[i] for i in live], greedy, max_new_tokens, tok.eos_token_id,
                            tok.pad_token_id)
            still = []
            for i, completion in zip(live, outs):
                message = assistant_message(tok.decode(completion, skip_special_tokens=True), True)
                before = convs[i] + [message]
                convs[i] = before
                if completion[-1:] != [tok.eos_token_id] or not message.get("tool_calls"):
                    continue
                registry = T.tools_for(T.as_task(chunk[i]))
                for call in message["tool_calls"]:
                    try:
                        ok, text = registry.execute_tool(call["function"]["name"],
                                                         **json.loads(call["function"]["arguments"]))
                    except (TypeError, ValueError) as exc:
                        text = f"Invalid arguments for tool {call['function']['name']!r}: {exc}"
                    convs[i] = convs[i] + [{"role": "tool", "tool_call_id": call["id"], "content": text}]
                streams[i] = streams[i] + completion + delta(tok, before, convs[i], tools)
                still.append(i)
            live = still
        for row, conv in zip(chunk, convs):
            scores.append((row["data"]["level"], T.score(row, conv)))
            used.append(any(m.get("tool_calls") for m in conv))
    levels = sorted({lv for lv, _ in scores})
    return {"success": sum(s for _, s in scores) / max(1, len(scores)), "n": len(scores),
            "by_level": {lv: sum(s for v, s in scores if v == lv) / sum(1 for v, _ in scores if v == lv)
                         for lv in levels},
            "tool_use": sum(used) / max(1, len(used))}
