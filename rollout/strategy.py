"""Strategy: the hooks an agent is, what it decides in the loop of ``rollout.loop`` (which does everything else):
the opening messages, how a reply is read, the feedback for one that cannot be, the messages that carry the
observations back, when a turn ends the episode, what the model is shown of the conversation, and a budget of
its own checked before each model call."""

from __future__ import annotations

from typing import Protocol

from rollout.errors import FormatError, TaskOutcome
from rollout.protocols import EnvReset
from rollout.records import Action, Message, Observation, Task, Trajectory


class Strategy(Protocol):
    """What an agent decides; the loop does everything else."""

    offers_tools: bool
    """Send the environment's tool schemas with every model call (function calling)."""

    def opening(self, task: Task, reset: EnvReset) -> list[Message]:
        """The conversation before the first model call."""
        ...

    def parse(self, message: Message) -> list[Action]:
        """The reply's actions; ``FormatError`` when it cannot be read."""
        ...

    def on_format_error(self, message: Message, error: FormatError) -> list[Message] | TaskOutcome:
        """The feedback for an unreadable reply, or the outcome it still is (e.g. a final answer)."""
        ...

    def on_no_actions(self, message: Message) -> TaskOutcome | None:
        """The outcome of a readable reply without actions (None: the turn goes on with none)."""
        ...

    def observe(self, observations: list[Observation]) -> list[Message]:
        """The messages that carry the observations back to the model."""
        ...

    def ended(self, message: Message, observations: list[Observation]) -> TaskOutcome | None:
        """The outcome of a turn whose actions ended the episode (a submission, the environment said done)."""
        ...

    def prompt(self, messages: list[Message]) -> list[Message]:
        """What the model is shown of the conversation at a call (the trajectory keeps the conversation itself)."""
        ...

    def before_query(self, trajectory: Trajectory) -> TaskOutcome | None:
        """A budget of the agent's own, checked before each model call (after the rollout's limits): the outcome
        that ends the episode instead, or None."""
        ...
