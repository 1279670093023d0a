"""The gateway's memory: each rollout's recorded calls, each with the earlier call it extends (``parent``) and the
conversation it belongs to (``segment``), bounded per rollout, in number of rollouts and in time.

A call's parent is the earlier call of the same rollout whose messages + reply are the longest prefix of its
messages; messages are compared by role, text, tool calls (id, name, arguments) and ``tool_call_id``, through a
hash of each prefix, so finding it costs one pass over the call's messages. A call that extends no earlier call (a
compacted or rewritten prompt) starts a new segment, numbered by its own index.

Bounds: at most ``max_calls`` calls per rollout (the oldest are dropped, counted in ``dropped``), at most
``max_rollouts`` rollouts (the least recently used goes first), and a rollout untouched for ``ttl`` seconds is
forgotten. Token ids and logprobs are kept as packed arrays (4 and 8 bytes a token, not a Python int's 36).
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator

from rollout.context import message_text
from rollout.wire.gateway_calls import CallSteps, calls_to_steps

PACKED = {"prompt_token_ids": "i", "completion_token_ids": "i", "logprobs": "d"}
"""The call fields kept as arrays, and their type codes."""


@dataclass
class _Rollout:
    calls: OrderedDict[int, dict[str, Any]] = field(default_factory=OrderedDict)
    ends: dict[int, int] = field(default_factory=dict)
    """Hash of (messages + reply) -> the index of the latest kept call that ended that way."""
    next_index: int = 1
    dropped: int = 0
    used: float = 0.0


def canon(message: dict[str, Any]) -> tuple[Any, ...]:
    """What two messages must share to be the same turn of a conversation."""
    calls = tuple((c.get("id") or "", (c.get("function") or {}).get("name") or "",
                   (c.get("function") or {}).get("arguments") or "")
                  for c in message.get("tool_calls") or [] if isinstance(c, dict))
    return message.get("role") or "", message_text(message), calls, message.get("tool_call_id") or ""


def prefix_hashes(messages: list[dict[str, Any]]) -> Iterator[int]:
    """A hash of each prefix ``messages[:k]``, k = 1..n."""
    h = 0
    for message in messages:
        h = hash((h, canon(message)))
        yield h


class CallStore:
    def __init__(self, max_calls: int = 1000, max_rollouts: int = 10_000, ttl: float = 3600.0):
        self.max_calls, self.max_rollouts, self.ttl = max_calls, max_rollouts, ttl
        self.rollouts: OrderedDict[str, _Rollout] = OrderedDict()

    def _rollout(self, rollout_id: str, create: bool) -> _Rollout | None:
        now = time.monotonic()
        while self.rollouts and next(iter(self.rollouts.values())).used < now - self.ttl:
            self.rollouts.popitem(last=False)
        state = self.rollouts.get(rollout_id)
        if state is None and create:
            state = self.rollouts[rollout_id] = _Rollout()
            while len(self.rollouts) > self.max_rollouts:
                self.rollouts.popitem(last=False)
        if state is not None:
            state.used = now
            self.rollouts.move_to_end(rollout_id)
        return state

    def record(self, rollout_id: str, call: dict[str, Any]) -> dict[str, Any]:
        """Keep ``call`` (``messages``, ``message``: the reply or None, token fields, ...); it gets its 1-based
        ``index``, ``parent`` and ``segment``."""
        state = self._rollout(rollout_id, create=True)
        assert state is not None
        hashes = list(prefix_hashes(call["messages"]))
        parent = next((state.ends[h] for h in reversed(hashes) if h in state.ends), None)
        index, state.next_index = state.next_index, state.next_index + 1
        call.update(index=index, parent=parent, segment=state.calls[parent]["segment"] if parent else index)
        end = None
        if call.get("message") is not None:
            end = hash((hashes[-1] if hashes else 0, canon(call["message"])))
            state.ends[end] = index
        kept = {k: array(PACKED[k], v) if k in PACKED and v is not None else v for k, v in call.items()}
        state.calls[index] = {**kept, "_end": end}
        while len(state.calls) > self.max_calls:
            _, old = state.calls.popitem(last=False)
            state.dropped += 1
            if state.ends.get(old["_end"]) == old["index"]:
                del state.ends[old["_end"]]
        return call

    def calls(self, rollout_id: str) -> list[dict[str, Any]]:
        """The rollout's kept calls as JSON-ready dicts, oldest first."""
        state = self._rollout(rollout_id, create=False)
        return [] if state is None else [{k: v.tolist() if isinstance(v, array) else v for k, v in c.items()
                                          if k != "_end"} for c in state.calls.values()]

    def dropped(self, rollout_id: str) -> int:
        """How many of the rollout's oldest calls were dropped to keep ``max_calls``."""
        state = self.rollouts.get(rollout_id)
        return state.dropped if state is not None else 0

    def steps(self, rollout_id: str) -> CallSteps:
        """The rollout's calls as Steps, token segments and contiguity breaks (``calls_to_steps``)."""
        return calls_to_steps(self.calls(rollout_id))

    def forget(self, rollout_id: str) -> bool:
        return self.rollouts.pop(rollout_id, None) is not None
