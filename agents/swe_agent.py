"""MiniSweAgent: one bash command per turn in a Runtime, submitted with the Mini-SWE sentinel.

run → query → parse (exactly one bash block) → execute → observe, until a command's first
output line is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (the rest of its output is the
submission) or a limit of ``rollout.termination`` ends it.
"""

from __future__ import annotations

from typing import Any

from agents import swe_prompts
from agents.tool_agent import execute
from pydantic import Field

from agents.parsers import load_parser
from rollout.context import RolloutContext
from rollout.errors import FormatError, Submitted
from rollout.protocols import ActionParser, Environment, Model
from rollout.records import Observation, Task
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
    submit_command: str = f"echo {swe_prompts.SUBMIT_SENTINEL} && git add -A && git diff --cached"
    """Shown to the model as the example of how to submit."""
    parser: str = "bash_block"
    parser_options: dict[str, Any] = Field(default_factory=dict)
    """Options of the parser (e.g. ``{max_actions: 1}``)."""
    command_timeout: float | None = None
    """Shown to the model on a timeout; the environment enforces its own."""


class MiniSweAgent:
    def __init__(self, config: MiniSweAgentConfig | None = None, parser: ActionParser | None = None):
        self.config = config or MiniSweAgentConfig()
        self.parser = parser or load_parser(self.config.parser, self.config.parser_options)

    def limits(self) -> Limits:
        return Limits.of(self.config)

    async def run(self, task: Task, model: Model, env: Environment, ctx: RolloutContext) -> None:
        reset = await ctx.reset_env(env, task)
        cfg = self.config
        variables = {
            "task": task,
            "problem": task.prompt or task.data.get("problem_statement", ""),
            "cwd": reset.info.get("cwd", "."),
            "sentinel": swe_prompts.SUBMIT_SENTINEL,
            "submit_command": cfg.submit_command,
        }
        ctx.add_messages(
            {"role": "system", "content": swe_prompts.render(cfg.system_template, "agent.system_template", **variables)},
            {"role": "user", "content": swe_prompts.render(cfg.instance_template, "agent.instance_template", **variables)},
            *reset.messages,
        )
        while True:
            step = await ctx.query(model)
            try:
                step.actions.extend(self.parser.parse(step.message))
            except FormatError as exc:
                step.format_error = str(exc)
                feedback = swe_prompts.render(
                    cfg.format_error_template, "agent.format_error_template",
                    error=str(exc), sentinel=swe_prompts.SUBMIT_SENTINEL,
                )
                ctx.add_messages({"role": "user", "content": feedback})
                ctx.step_done(step)
                ctx.termination.format_error(str(exc))
                continue
            observations = await execute(env, step, ctx)
            for obs in observations:
                submission = submitted_output(obs)
                if submission is not None:
                    ctx.step_done(step)
                    raise Submitted("the agent submitted", submission=submission)
            ctx.add_messages(*({"role": "user", "content": self.observe(o)} for o in observations))
            ctx.step_done(step)
            ctx.termination.after_observations(observations)

    def observe(self, obs: Observation) -> str:
        info: dict[str, Any] = obs.info
        return swe_prompts.render(
            self.config.observation_template,
            "agent.observation_template",
            returncode=info.get("returncode", 0 if obs.success else 1),
            timed_out=info.get("timed_out", False),
            truncated=info.get("truncated", False),
            output_limit=f"{info['output_limit']:,} bytes" if info.get("output_limit") else "the output limit",
            timeout=info.get("timeout", self.config.command_timeout),
            **swe_prompts.elide(obs.content, self.config.max_observation_chars),
        )


def submitted_output(obs: Observation) -> str | None:
    """The submission if the command's first output line is exactly the sentinel."""
    if obs.info.get("timed_out"):
        return None
    head, _, rest = obs.content.lstrip().partition("\n")
    if head.strip() == swe_prompts.SUBMIT_SENTINEL:
        return rest
    return None
