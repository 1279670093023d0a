"""AviaryStepAgent: function calling against a step environment that answers a whole round at once (an Aviary
resources server: every tool call of a reply goes to the environment in one step, which says when it is done).

Each reply's tool calls are one step; each output goes back as a ``role: tool`` message, followed by the messages
the environment sent besides (``Observation.info["messages"]``, e.g. the new state of a game) as they came. Ends when
the environment says done (``environment_done``), on a reply without tool calls (``natural_completion``, or a
corrective message and another turn with ``done_if_no_tool_calls: false``), or at any limit of
``rollout.termination``, plus ``max_total_sequence_length`` (``token_limit``). The loop is ``rollout.loop``.

Which messages hold an environment state comes from the environment: ``EnvReset.info["env_state"]`` and
``Observation.info["env_state"]`` are positions in the opening messages and in ``info["messages"]``.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import Field

from agents.parsers.openai_tools import OpenAIToolsParser
from agents.tool_agent import ToolCallingAgent
from rollout.errors import FormatError, TaskOutcome, TokenLimitExceeded
from rollout.protocols import EnvReset
from rollout.records import Action, Message, Observation, Task, Trajectory
from rollout.termination import Limits

NO_TOOL_CALL = ("Your reply called no tool. Act in the environment by calling one of the offered tools "
                "(check the tool's name and that its arguments are a JSON object).")


class AviaryStepAgentConfig(Limits):
    type: str = "aviary"
    system_prompt: str | None = None
    """Prepended as a system message unless the task brings its own ``messages``."""
    max_total_sequence_length: int | None = Field(default=None, ge=1)
    """Tokens a prompt may hold: the rollout ends (``token_limit``) before a model call once the last call's prompt
    and completion tokens reach it, since the next prompt holds them and more (a caller's ``ModelResponse.usage`` in a
    ``session``). None: the server's context window decides (its rejection is a ``token_limit`` too)."""
    done_if_no_tool_calls: bool = True
    """A reply without tool calls ends the episode (``natural_completion``). False: ``no_tool_call_message`` goes
    back and the loop goes on; such replies count as format errors (``max_consecutive_format_errors`` ends it)."""
    no_tool_call_message: str = NO_TOOL_CALL
    """The corrective user message after a reply without tool calls (``done_if_no_tool_calls: false``)."""
    collapse_old_env_states: bool = False
    """The model sees only the latest environment state: every earlier one is replaced by
    ``old_env_state_message`` in the prompt (the trajectory keeps them all). Shorter prompts, but each prompt is
    no longer an extension of the previous one: prefix-cache reuse is lost past the first replaced state, and the
    turns' token ids are not one contiguous sequence (``token_breaks`` in the result). A caller that owns generation
    (``session``) gets the same prompt from ``request()``."""
    old_env_state_message: str = "(an earlier state of the environment, since replaced)"
    """What the model sees in place of an earlier environment state."""


def _marked(messages: list[Message], states: Any) -> list[tuple[Message, bool]]:
    positions = set(states or ())
    return [(dict(m), i in positions) for i, m in enumerate(messages)]


class AviaryStepAgent(ToolCallingAgent):
    """Shared by every rollout: each episode (``run`` or ``session``) plays a copy of its own (``for_episode``), which
    remembers which of the episode's messages hold an environment state."""

    offers_tools = True

    def __init__(self, config: AviaryStepAgentConfig | None = None):
        self.config = config or AviaryStepAgentConfig()
        self.parser = OpenAIToolsParser()
        self.states: dict[int, Message] = {}
        """The episode's messages that hold an environment state, by identity (the loop adds these very dicts)."""

    def for_episode(self) -> AviaryStepAgent:
        episode = copy.copy(self)
        episode.states = {}
        return episode

    # ---- the hooks, as (message, holds an environment state) pairs --------------------------------------

    def opening_pairs(self, task: Task, reset: EnvReset) -> list[tuple[Message, bool]]:
        if task.messages is not None or task.prompt:
            head = task.opening_messages(self.config.system_prompt)
        else:  # the environment's opening messages are the task (Aviary rows often carry no prompt)
            head = [{"role": "system", "content": self.config.system_prompt}] if self.config.system_prompt else []
        return [(m, False) for m in head] + _marked(reset.messages, reset.info.get("env_state"))

    def observation_pairs(self, observations: list[Observation]) -> list[tuple[Message, bool]]:
        """Tool replies first (each call answered before anything else), then the environment's other messages."""
        replies = [({"role": "tool", "tool_call_id": o.call_id or "", "content": o.content}, False)
                   for o in observations]
        extra = [pair for o in observations for pair in _marked(o.info.get("messages") or [], o.info.get("env_state"))]
        return replies + extra

    def opening(self, task: Task, reset: EnvReset) -> list[Message]:
        return self._remember(self.opening_pairs(task, reset))

    def observe(self, observations: list[Observation]) -> list[Message]:
        return self._remember(self.observation_pairs(observations))

    def _remember(self, pairs: list[tuple[Message, bool]]) -> list[Message]:
        if self.config.collapse_old_env_states:
            self.states.update((id(m), m) for m, state in pairs if state)
        return [m for m, _ in pairs]

    def parse(self, message: Message) -> list[Action]:
        actions = self.parser.parse(message)
        if not actions and not self.config.done_if_no_tool_calls:
            raise FormatError(self.config.no_tool_call_message)
        return actions

    # ---- what the model is shown, and the length budget ---------------------------------------------------

    def prompt(self, messages: list[Message]) -> list[Message]:
        """``messages`` with every environment state but the latest replaced by ``old_env_state_message``."""
        shown = [i for i, m in enumerate(messages) if id(m) in self.states]
        if len(shown) < 2:
            return messages
        hidden = set(shown[:-1])
        return [{"role": m.get("role", "user"), "content": self.config.old_env_state_message} if i in hidden else m
                for i, m in enumerate(messages)]

    def before_query(self, trajectory: Trajectory) -> TaskOutcome | None:
        """``max_total_sequence_length``: the next prompt holds the last call's prompt and completion, and more."""
        limit = self.config.max_total_sequence_length
        if limit is None or not trajectory.steps:
            return None
        usage = trajectory.steps[-1].usage
        used = usage.prompt_tokens + usage.completion_tokens
        if used < limit:
            return None
        return TokenLimitExceeded(f"the conversation holds {used} tokens already; the next prompt would exceed "
                                  f"max_total_sequence_length={limit}")
