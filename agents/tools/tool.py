"""Tools: typed parameter definitions that render to OpenAI tool schemas, and the Tool base class.

A tool is a ``ToolDefinition`` (name, description, typed ``ToolParameter`` list) plus an
``execute(**params)`` that may be sync or async. ``FunctionTool`` / ``@tool`` wrap a plain
function with an explicit parameter list.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.dataclasses import dataclass

ParameterType = Literal["string", "number", "integer", "boolean", "array", "object"]


@dataclass(config=ConfigDict(extra="forbid"))
class ToolParameter:
    """One named argument of a tool."""

    name: str
    type: ParameterType = "string"
    description: str = ""
    required: bool = True
    enum: list[Any] | None = None
    """The only values accepted, if set."""
    default: Any = None
    """Passed to the tool when an optional parameter is missing (None: nothing is passed)."""
    items: ParameterType | None = None
    """Element type of an ``array`` parameter (elements are checked against it)."""

    def to_schema(self) -> dict[str, Any]:
        """This parameter's JSON-schema property."""
        schema: dict[str, Any] = {"type": self.type}
        if self.description:
            schema["description"] = self.description
        if self.type == "array" and self.items is not None:
            schema["items"] = {"type": self.items}
        if self.enum is not None:
            schema["enum"] = list(self.enum)
        if self.default is not None:
            schema["default"] = copy.deepcopy(self.default)
        return schema


@dataclass(config=ConfigDict(extra="forbid"))
class ToolDefinition:
    """What the model is told about a tool."""

    name: str
    description: str = ""
    parameters: list[ToolParameter] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> ToolDefinition:
        seen: set[str] = set()
        for param in self.parameters:
            if param.name in seen:
                raise ValueError(f"tool {self.name!r} declares parameter {param.name!r} twice")
            seen.add(param.name)
        return self

    def parameter(self, name: str) -> ToolParameter | None:
        return next((p for p in self.parameters if p.name == name), None)

    def to_openai_schema(self) -> dict[str, Any]:
        """``{"type": "function", "function": {name, description, parameters: <JSON schema>}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: p.to_schema() for p in self.parameters},
                    "required": [p.name for p in self.parameters if p.required],
                },
            },
        }


class Tool:
    """Base class: set ``definition`` (class attribute or constructor) and implement ``execute``.

    ``execute`` may be a plain method or ``async def``. A plain one runs directly in the event
    loop, which is right for cheap work; set ``run_in_thread`` for anything that blocks (file
    or network I/O, subprocesses, heavy computation) so other rollouts keep going.
    ``timeout`` (seconds) bounds one call of an async or threaded tool (a plain call in the
    loop cannot be interrupted); a thread that overruns is abandoned, not killed.
    """

    definition: ToolDefinition | None = None
    """What the model is told about the tool: a class attribute of the subclass, or the constructor's argument (a
    tool made without one is refused)."""
    run_in_thread: bool = False
    timeout: float | None = None

    def __init__(
        self,
        definition: ToolDefinition | None = None,
        *,
        run_in_thread: bool | None = None,
        timeout: float | None = None,
    ):
        if definition is not None:
            self.definition = definition
        if run_in_thread is not None:
            self.run_in_thread = run_in_thread
        if timeout is not None:
            self.timeout = timeout
        if not isinstance(self.definition, ToolDefinition):
            raise TypeError(f"{type(self).__name__} needs a ToolDefinition")

    @property
    def name(self) -> str:
        return self.definition.name

    def execute(self, **params: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.execute")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


ParameterSpec = ToolParameter | dict[str, Any]


class FunctionTool(Tool):
    """A tool made from a plain (sync or async) function and an explicit parameter list.

    The name defaults to the function's name, the description to its docstring's first paragraph.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        parameters: Iterable[ParameterSpec] = (),
        *,
        name: str | None = None,
        description: str | None = None,
        run_in_thread: bool = False,
        timeout: float | None = None,
    ):
        if description is None:
            doc = inspect.getdoc(fn) or ""
            description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
        definition = ToolDefinition(
            name=name or fn.__name__,
            description=description,
            parameters=[p if isinstance(p, ToolParameter) else ToolParameter(**p) for p in parameters],
        )
        super().__init__(definition, run_in_thread=run_in_thread, timeout=timeout)
        self.fn = fn

    def execute(self, **params: Any) -> Any:
        return self.fn(**params)


def tool(
    name: str | Callable[..., Any] | None = None,
    description: str | None = None,
    parameters: Iterable[ParameterSpec] = (),
    *,
    run_in_thread: bool = False,
    timeout: float | None = None,
) -> Any:
    """Decorator: ``@tool(parameters=[ToolParameter("x", "integer")])`` turns a function into a
    ``FunctionTool``. Bare ``@tool`` works for functions without parameters."""
    if callable(name):
        return FunctionTool(name)

    def wrap(fn: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(
            fn, parameters, name=name, description=description, run_in_thread=run_in_thread, timeout=timeout
        )

    return wrap
