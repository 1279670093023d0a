"""Rows for supervised fine-tuning, one per rollout, in the shape of Harbor's ``harbor traces export`` (its ``hf``
rows; ``--sharegpt`` adds ``conversations_sharegpt``), made from the rollout's ATIF document (``rollout.formats.atif``)
so that both exports tell the same story.

A row is the conversation up to the rollout's last own model call (Harbor's last episode): system steps become
``user`` messages (the first one headed by the tool definitions in a ``<tools>`` block), user steps ``user``, agent
steps ``assistant`` (``<think>`` reasoning, the text, then each native tool call as a ``<tool_call>`` JSON block),
and each agent step's observation one ``user`` message, except the last agent step's. Steps marked
``is_copied_context`` stay in the conversation as context, but never end it.
"""

from __future__ import annotations

import json
from typing import Any

SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt"}


def trace_row(doc: dict[str, Any], sharegpt: bool = True) -> dict[str, Any] | None:
    """The row of one ATIF document, or None when it holds no model call of its own (nothing to learn)."""
    steps = doc["steps"]
    own = [i for i, step in enumerate(steps) if step["source"] == "agent" and not step.get("is_copied_context")]
    if not own:
        return None
    agent, extra = doc["agent"], doc.get("extra") or {}
    tools = agent.get("tool_definitions")
    episode = steps[: own[-1] + 1]
    row: dict[str, Any] = {
        "conversations": conversation(episode, tools),
        "agent": agent["name"],
        "model": agent.get("model_name"),
        "model_provider": (agent.get("extra") or {}).get("model_provider"),
        "date": next((s["timestamp"] for s in steps if s.get("timestamp")), None),
        "task": extra.get("task_id"),
        "episode": f"episode-{len(own) - 1}",
        "run_id": extra.get("run_id"),
        "trial_name": extra.get("rollout_id"),
        "result": _result(doc),
    }
    if tools:
        row["tool_definitions"] = tools
    if sharegpt:
        row["conversations_sharegpt"] = [{"from": SHAREGPT_ROLES[m["role"]], "value": m["content"]}
                                         for m in row["conversations"]]
    return row


def conversation(steps: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[dict[str, str]]:
    """Steps (up to and including the last agent step to learn from) as ``{"role", "content"}`` messages."""
    last_agent = max((i for i, step in enumerate(steps) if step["source"] == "agent"), default=-1)
    out: list[dict[str, str]] = []
    tools_shown = not tools
    for i, step in enumerate(steps):
        text = _text(step.get("message"))
        if step["source"] == "system":
            if not tools_shown:
                text = f"<tools>\n{json.dumps(tools, ensure_ascii=False, indent=2)}\n</tools>\n\n{text}"
                tools_shown = True
            out.append({"role": "user", "content": text})
        elif step["source"] == "user":
            out.append({"role": "user", "content": text})
        else:
            out.append({"role": "assistant", "content": _assistant(step, text)})
            results = ((step.get("observation") or {}).get("results") or []) if i != last_agent else []
            shown = [_text(r["content"]) for r in results if "content" in r]
            if shown:
                out.append({"role": "user", "content": "\n".join(shown)})
    return out


def _assistant(step: dict[str, Any], text: str) -> str:
    parts = []
    if step.get("reasoning_content"):
        parts.append(f"<think>{step['reasoning_content']}</think>")
    if text:
        # a reply whose opening <think> was part of the prompt (vLLM returns only the generated text)
        parts.append("<think>" + text if "</think>" in text and "<think>" not in text else text)
    for call in step.get("tool_calls") or []:
        body = json.dumps({"name": call["function_name"], "arguments": call.get("arguments", {})}, ensure_ascii=False)
        parts.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(parts)


def _text(content: Any) -> str:
    """A message or observation content as text: a string as is, else the first part's text, else JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict) and "text" in content[0]:
        first = content[0]["text"]
        return first if isinstance(first, str) else json.dumps(first, ensure_ascii=False)
    return json.dumps(content, ensure_ascii=False)


def _result(doc: dict[str, Any]) -> str | None:
    """Harbor's ``result`` column: the reward as a string, or the error type of a rollout that has none."""
    reward = ((doc.get("final_metrics") or {}).get("extra") or {}).get("reward")
    if reward is not None:
        return str(float(reward))
    error = (doc.get("extra") or {}).get("error")
    return error["type"] if error else None
