"""The seams: small async Protocols that models, runtimes, environments, verifiers, parsers and
agents implement. Implementations never inherit from them; they only match the shape.

Beside them, what a part may offer beyond its seam, declared here and never probed by name: optional abilities as
Protocols (``HasRuntime``, ``EndsSessions``, ``HoldsConnections``, ``HasLimits``, ``Staged``, ``HoldsSolution``; a
runtime's ``HasWorkdir`` and ``HasConfig``), asked with ``isinstance``; and capability flags as class attributes with
their defaults (``AgentCapabilities``, ``EnvironmentCapabilities``), read through ``declared``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, runtime_checkable

from pydantic import Field

from rollout.records import Action, Message, Observation, Record, RequestMeta, Reward, RolloutResult, Task, Usage

if TYPE_CHECKING:
    from rollout.context import RolloutContext
    from rollout.termination import Limits


class ModelResponse(Record):
    """One assistant turn, with token data when the engine returns it."""

    message: Message
    finish_reason: str | None = "stop"
    usage: Usage = Field(default_factory=Usage)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    model: str = ""
    policy_version: str | None = None


@runtime_checkable
class Model(Protocol):
    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        meta: RequestMeta | None = None,
        **sampling: Any,
    ) -> ModelResponse:
        """Return the next assistant message. Raises ``ContextLengthExceeded`` when the prompt no
        longer fits, ``ModelError`` when the endpoint keeps failing."""
        ...


@runtime_checkable
class EndsSessions(Protocol):
    """An optional ability of a model: it keeps something per rollout (a token stream, the replica a sticky router
    gave the rollout) that it lets go of when the rollout ends. The runner calls it once per rollout, whatever
    the outcome."""

    async def end_session(self, meta: RequestMeta) -> None:
        """Best effort: never raises."""
        ...


@runtime_checkable
class HoldsConnections(Protocol):
    """An optional ability of a model: connections (HTTP sessions, pools) that its owner closes when done with it."""

    async def aclose(self) -> None: ...


class GatewayLease(Record):
    """One rollout's door to the model gateway, as the rollout's sandbox sees it: the gateway's unix socket (a path
    inside the rollout's runtime), the URL path of the rollout's OpenAI base, and a key good for this rollout alone."""

    rollout_id: str
    socket: str
    path: str
    """``/rollouts/<rollout id>/v1``: the base URL's path, after whatever address reaches the socket."""
    api_key: str


@runtime_checkable
class ModelGateway(Protocol):
    """The gateway the farm opens for an agent that only speaks OpenAI (a harness it did not write): each rollout's
    calls go through it to the run's model, recorded with their token data, and only with that rollout's key."""

    async def open(self, meta: RequestMeta) -> GatewayLease:
        """A lease for this rollout (an earlier lease of the same rollout id, and its calls, are dropped)."""
        ...

    async def calls(self, rollout_id: str) -> dict[str, Any]:
        """``{"calls": [...], "dropped": n}``: what the rollout's lease recorded (``rollout.wire.gateway_calls``)."""
        ...

    async def close(self, rollout_id: str) -> None:
        """The lease ends: its key is refused from now on, its calls forgotten."""
        ...


@runtime_checkable
class TakesGateway(Protocol):
    """An optional ability of an agent: its model calls come from a program of its own through a gateway the farm
    opens per rollout. The composition binds one when ``needs_gateway()`` (no gateway of the user's own named)."""

    def needs_gateway(self) -> bool: ...

    def bind_gateway(self, gateway: ModelGateway) -> None: ...


class ExecResult(Record):
    output: str
    returncode: int
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0


@runtime_checkable
class Runtime(Protocol):
    """A container or workspace that runs shell commands. A failing command is output with a
    return code, not an exception; ``RuntimeFailure`` means the runtime itself broke."""

    async def start(self) -> None: ...

    async def exec(
        self, command: str, timeout: float | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run ``command`` through the runtime's shell. ``stdin``: bytes the command reads on its standard
        input, then end of file (none: end of file at once). Written while the output is read, so a command
        may read and write in any order; nothing of it is on a command line or in a file."""
        ...

    async def write_file(self, path: str, data: bytes) -> None: ...

    async def read_file(self, path: str) -> bytes: ...

    async def close(self) -> None:
        """Idempotent."""
        ...


@runtime_checkable
class HasWorkdir(Protocol):
    """An optional ability of a runtime: where its commands run when no ``cwd`` is given (a relative ``cwd`` is
    relative to it); None while the runtime cannot say yet (a workspace made at ``start``)."""

    @property
    def workdir(self) -> str | None: ...


@runtime_checkable
class HasConfig(Protocol):
    """An optional ability of a runtime: the section of the run's config it was built from, so that what
    ``rollout.config.components`` asks of a section (``RunsImages``, ``CapsOutput``) is asked of a runtime's."""

    @property
    def config(self) -> Any: ...


class EnvReset(Record):
    """What an environment offers at the start: extra opening messages and tool schemas."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    info: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    async def reset(self, task: Task) -> EnvReset: ...

    async def step(self, actions: list[Action]) -> list[Observation]:
        """One observation per action, in order. Tool failures are observations with
        ``success=False``, never exceptions."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class HasRuntime(Protocol):
    """An optional capability of an environment: its commands run in ``runtime`` with ``runtime_env`` set. An
    agent that runs a command of its own (``agents.external_agent``) runs it there, beside the environment's."""

    @property
    def runtime(self) -> Runtime: ...

    @property
    def runtime_env(self) -> dict[str, str]:
        """The environment variables every command of the environment runs with (e.g. ``PAGER: cat``)."""
        ...


@runtime_checkable
class Staged(Protocol):
    """An optional ability of an environment: a task in stages (Harbor's multi-step tasks). Each time the agent's run
    of a stage ends with a task outcome, the runner asks for the next stage and runs the agent on it in the same
    environment (``rollout.runner.run_stages``)."""

    async def next_stage(self) -> Task | None:
        """Grade the stage just done; the next stage's task (its instruction as the prompt), or None: no stage is
        left, or this one's gate was not met."""
        ...


@runtime_checkable
class HoldsSolution(Protocol):
    """An optional ability of an environment: the task's reference solution (a Harbor task's ``solution/``), run in
    the environment for an agent that checks the task rather than solves it (the oracle agent)."""

    async def run_reference_solution(self, timeout: float | None = None) -> ExecResult:
        """Run the solution where the agent's commands run (``timeout`` seconds; none: the task's own limit); its
        output and exit code. Raises ``EnvironmentFailure`` when the task has no solution."""
        ...


class EnvironmentCapabilities:
    """The capability flags of an environment class, with the values of one that declares none (as Gymnasium's
    ``Env.metadata``): a class that has another value inherits this and sets it."""

    closes_sessions: ClassVar[bool] = False
    """``close`` ends a session on a remote server (a resources server), so the environment takes the agent server's
    ``gym.cleanup_timeout`` as its ``cleanup_timeout``."""


@runtime_checkable
class Verifier(Protocol):
    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        """The verdict on a finished rollout, its environment still open. What the rollout returns besides its
        reward (the Responses object a ``/verify`` read) the verifier records on ``result.outputs``: nothing but
        the verdict travels in the ``Reward``."""
        ...


@runtime_checkable
class GradingSource(Protocol):
    """What an environment offers a verifier that grades in a fresh runtime, never the agent's (SWE): the
    patch to grade, where the repository is, and a new runtime of the task's image or workspace kind."""

    async def final_patch(self, submission: str | None) -> tuple[str | None, str]:
        """(the patch, where it came from: "submission", "diff", "none")."""
        ...

    def repo_dir_for(self, task: Task) -> str: ...

    def fresh_runtime(self, task: Task) -> "Runtime": ...


@runtime_checkable
class ActionParser(Protocol):
    def parse(self, message: Message) -> list[Action]:
        """Actions in the message, or raise ``FormatError`` whose text is fed back to the model."""
        ...


@runtime_checkable
class Agent(Protocol):
    async def run(self, task: Task, model: Model, env: Environment, ctx: "RolloutContext") -> None:
        """Drive the episode, appending to ``ctx.trajectory``; end by raising a ``TaskOutcome``
        (``Submitted``, ``NaturalCompletion``, a limit, ...). Infrastructure errors propagate."""
        ...


@runtime_checkable
class HasLimits(Protocol):
    """An optional ability of an agent: the limits its config sets (steps, tokens, time); the rollouts of an agent
    without it run under the run's limits alone."""

    def limits(self) -> Limits: ...


class AgentCapabilities:
    """The capability flags of an agent class, with the values of one that declares none: a class that has another
    value inherits this and sets it (``rollout.loop.LoopAgent`` inherits it for every agent built on the loop)."""

    speaks_responses_api: ClassVar[bool] = True
    """The agent can play the tool loop alone on a Responses request (the agent server's ``/v1/responses``); False
    for one that owns the whole episode (the Mini-SWE agent: 501 there)."""


C = TypeVar("C")


def declared(component: object, capabilities: type[C]) -> type[C]:
    """Where ``component``'s capability flags are read (a class, as a registry resolves it, or an instance): its own
    class when it inherits ``capabilities``, else ``capabilities`` itself, whose values are the defaults."""
    cls = component if isinstance(component, type) else type(component)
    return cls if issubclass(cls, capabilities) else capabilities


@runtime_checkable
class ToolExecutor(Protocol):
    """What a tool environment needs from a tool registry (``agents.tools.ToolRegistry`` is one)."""

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI tool JSON schemas of every registered tool."""
        ...

    async def execute(self, action: Action) -> Observation:
        """Run one tool call. Unknown tools, bad arguments and exceptions come back as
        ``Observation(success=False, info={"error": "unknown_tool" | "invalid_arguments" |
        "execution_error"})``, never as exceptions."""
        ...
