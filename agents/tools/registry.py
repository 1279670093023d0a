"""ToolRegistry: registers tools, renders their schemas, validates arguments, runs calls, and turns
every failure into an error observation (a ``rollout.protocols.ToolExecutor``)."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Iterable
from typing import Any

from agents.tools.tool import Tool
from agents.tools.validation import check_arguments
from rollout.errors import InfrastructureError, TaskOutcome
from rollout.records import Action, Observation

# Errors a tool may raise on purpose that are not its failure: a submit tool ending the episode
# (TaskOutcome) or a broken container underneath (InfrastructureError, retried, never scored).
PASS_THROUGH = (TaskOutcome, InfrastructureError)


class ToolCallFailed(Exception):
    """Internal: a failed call, with the observation's ``info["error"]`` kind and its text."""

    def __init__(self, kind: str, text: str):
        super().__init__(kind, text)
        self.kind = kind
        self.text = text


class ToolRegistry:
    """The tools one environment offers.

    Failure texts are fixed, because models learn to read them:
    ``Tool 'x' not found`` (``unknown_tool``), ``Invalid arguments for tool 'x': ...``
    (``invalid_arguments``) and ``Tool execution error: <exception text>`` (``execution_error``).
    ``TaskOutcome`` and ``InfrastructureError`` raised by a tool propagate: they are control
    flow and infrastructure, not the model's mistake.
    """

    def __init__(self, tools: Iterable[Tool] = ()):
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: Tool, *, replace: bool = False) -> Tool:
        """Add a tool (returned, so this works as a decorator on ``@tool`` results too)."""
        if not isinstance(tool, Tool):
            raise TypeError(f"register() takes a Tool, got {type(tool).__name__}; wrap functions with FunctionTool")
        if tool.name in self._tools and not replace:
            raise ValueError(f"a tool named {tool.name!r} is already registered (pass replace=True to swap it)")
        self._tools[tool.name] = tool
        return tool

    def get_tool(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Tool names in registration order."""
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI tool schemas, in registration order."""
        return [t.definition.to_openai_schema() for t in self._tools.values()]

    def validate(self, name: str, params: Any) -> tuple[bool, str, dict[str, Any]]:
        """``(ok, error text, arguments to call with)``; the error text is what the model would see."""
        try:
            _, coerced = self._prepare(name, params)
        except ToolCallFailed as failure:
            return False, failure.text, {}
        return True, "", coerced

    def execute_tool(self, name: str, **params: Any) -> tuple[bool, str]:
        """Run one call synchronously: ``(success, result text or error text)``.

        Async tools are run with ``asyncio.run``, so this cannot be used from inside a running
        event loop for them; use ``await execute(action)`` there.
        """
        try:
            tool, coerced = self._prepare(name, params)
            result = self._invoke(tool, coerced)
            if inspect.isawaitable(result):
                result = self._run_awaitable(tool, result)
        except ToolCallFailed as failure:
            return False, failure.text
        return True, format_result(result)

    async def execute(self, action: Action) -> Observation:
        """Run one call in the event loop (or a thread, for ``run_in_thread`` tools); any failure
        comes back as ``Observation(success=False, info={"error": kind})``."""
        started = time.perf_counter()
        try:
            tool, coerced = self._prepare(action.name, action.arguments)
            if tool.run_in_thread:
                pending: Any = asyncio.to_thread(self._invoke, tool, coerced)
                result = await _bounded(tool, pending)
                if inspect.isawaitable(result):  # an async function run in a thread returns its coroutine
                    result = await _bounded(tool, result)
            else:
                result = self._invoke(tool, coerced)
                if inspect.isawaitable(result):
                    result = await _bounded(tool, result)
            content, success, info = format_result(result), True, {}
        except ToolCallFailed as failure:
            content, success, info = failure.text, False, {"error": failure.kind}
        info["duration"] = time.perf_counter() - started
        return Observation(content=content, success=success, call_id=action.call_id, action_name=action.name, info=info)

    def _prepare(self, name: str, params: Any) -> tuple[Tool, dict[str, Any]]:
        tool = self._tools.get(name)
        if tool is None:
            raise ToolCallFailed("unknown_tool", f"Tool '{name}' not found")
        coerced, problems = check_arguments(tool.definition, params)
        if problems:
            raise ToolCallFailed("invalid_arguments", f"Invalid arguments for tool '{name}': {'; '.join(problems)}")
        return tool, coerced

    @staticmethod
    def _invoke(tool: Tool, params: dict[str, Any]) -> Any:
        try:
            return tool.execute(**params)
        except PASS_THROUGH:
            raise
        except Exception as exc:
            raise ToolCallFailed("execution_error", f"Tool execution error: {exc}") from exc

    @staticmethod
    def _run_awaitable(tool: Tool, awaitable: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(_bounded(tool, awaitable))
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # never awaited: close it so Python does not warn
        raise ToolCallFailed(
            "execution_error",
            f"Tool execution error: async tool '{tool.name}' cannot run synchronously inside a running event loop",
        )


async def _bounded(tool: Tool, awaitable: Any) -> Any:
    """Await a tool's result under its timeout, mapping its exceptions like ``_invoke`` does."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=tool.timeout)
    except asyncio.CancelledError:
        task.cancel()  # the rollout was cancelled: do not leave the tool running
        raise
    if not done:
        task.cancel()  # a threaded tool cannot be stopped; its result is dropped
        raise ToolCallFailed("execution_error", f"Tool execution error: timed out after {tool.timeout:g}s")
    try:
        return task.result()
    except (ToolCallFailed, *PASS_THROUGH):
        raise
    except Exception as exc:
        raise ToolCallFailed("execution_error", f"Tool execution error: {exc}") from exc


def format_result(result: Any) -> str:
    """A tool's return value as observation text: strings as they are, anything else as JSON
    (``str()`` when it does not serialise). Lone surrogates become U+FFFD so the trajectory
    can always be written as UTF-8."""
    if isinstance(result, str):
        text = result
    else:
        try:
            text = json.dumps(result, ensure_ascii=False)
        except (TypeError, ValueError):
            text = str(result)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
