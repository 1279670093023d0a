"""MiniSweAgent: one bash command per turn in a Runtime, submitted with the Mini-SWE sentinel.

Each reply must hold exactly one bash block; its output comes back through the observation template, until a
command's first output line is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (the rest of its output is the
submission) or a limit of ``rollout.termination`` ends it. The loop is ``rollout.loop``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agents import swe_prompts
from agents.parsers import load_parser
from rollout.errors import SUBMIT_SENTINEL, FormatError, Submitted, TaskOutcome
from rollout.loop import LoopAgent
from rollout.protocols import ActionParser, EnvReset
from rollout.records import Message, Observation, Task
from rollout.termination import Limits


class MiniSweAgentConfig(Limits):
    max_steps: int | None = Field(default=250, ge=1)
    """Model calls per rollout (NeMo Gym's Mini SWE default); None for no limit."""
    type: str = "mini_swe"
    system_template: str = swe_prompts.SYSTEM_TEMPLATE
    instance_template: str = swe_prompts.INSTANCE_TEMPLATE
    """Jinja (strict undefined) with ``task``, ``problem``, ``cwd``, ``sentinel``, ``submit_command``."""
    observation_template: str = swe_prompts.OBSERVATION_TEMPLATE
    format_error_template: str = swe_prompts.FORMAT_ERROR_TEMPLATE
    max_observation_chars: int = 10_000
    """Longer outputs keep their head and tail; the model is told how much was elided."""
    submit_command: str = f"echo {SUBMIT_SENTINEL} && git add -A && git diff --cached"
    """Shown to the model as the example of how to submit."""
    parser: str = "bash_block"
    parser_options: dict[str, Any] = Field(default_factory=dict)
    """Options of the parser (e.g. ``{max_actions: 1}``)."""
    command_timeout: float | None = None
    """Shown to the model on a timeout; the environment enforces its own."""


class MiniSweAgent(LoopAgent):
    speaks_responses_api = False
    """It owns the whole episode (its prompts, the submission in the repository): the agent server answers 501 on
    ``/v1/responses``, as NeMo Gym's Mini SWE agent does (``rollout.protocols.AgentCapabilities``)."""

    def __init__(self, config: MiniSweAgentConfig | None = None, parser: ActionParser | None = None):
        self.config = config or MiniSweAgentConfig()
        self.parser = parser or load_parser(self.config.parser, self.config.parser_options)

    def opening(self, task: Task, reset: EnvReset) -> list[Message]:
        cfg, sentinel = self.config, SUBMIT_SENTINEL
        variables = {"task": task, "problem": task.prompt or task.data.get("problem_statement", ""),
                     "cwd": reset.info.get("cwd", "."), "sentinel": sentinel, "submit_command": cfg.submit_command}
        system = swe_prompts.render(cfg.system_template, "agent.system_template", **variables)
        instance = swe_prompts.render(cfg.instance_template, "agent.instance_template", **variables)
        return [{"role": "system", "content": system}, {"role": "user", "content": instance}, *reset.messages]

    def on_format_error(self, message: Message, error: FormatError) -> list[Message]:
        feedback = swe_prompts.render(self.config.format_error_template, "agent.format_error_template",
                                      error=str(error), sentinel=SUBMIT_SENTINEL)
        return [{"role": "user", "content": feedback}]

    def observe(self, observations: list[Observation]) -> list[Message]:
        if any(submitted_output(o) is not None for o in observations):
            return []  # the episode ends with this turn: nothing goes back to the model
        return [{"role": "user", "content": self.observation(o)} for o in observations]

    def ended(self, message: Message, observations: list[Observation]) -> TaskOutcome | None:
        for obs in observations:
            submission = submitted_output(obs)
            if submission is not None:
                return Submitted("the agent submitted", submission=submission)
        return None

    def observation(self, obs: Observation) -> str:
        info: dict[str, Any] = obs.info
        return swe_prompts.render(
            self.config.observation_template, "agent.observation_template",
            returncode=info.get("returncode", 0 if obs.success else 1), timed_out=info.get("timed_out", False),
            truncated=info.get("truncated", False), timeout=info.get("timeout", self.config.command_timeout),
            output_limit=f"{info['output_limit']:,} bytes" if info.get("output_limit") else "the output limit",
            **swe_prompts.elide(obs.content, self.config.max_observation_chars),
        )


def submitted_output(obs: Observation) -> str | None:
    """The submission if the command's first output line is exactly the sentinel."""
    if obs.info.get("timed_out"):
        return None
    head, _, rest = obs.content.lstrip().partition("\n")
    return rest if head.strip() == SUBMIT_SENTINEL else None
