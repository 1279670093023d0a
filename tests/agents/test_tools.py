"""Tools and the tool registry: schemas, argument validation, execution and its failure texts."""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import threading

import pytest
from pydantic import ValidationError

from agents.tools import FunctionTool, Tool, ToolDefinition, ToolParameter, ToolRegistry, tool
from rollout.errors import ModelError, RuntimeFailure, Submitted
from rollout.protocols import ToolExecutor
from rollout.records import Action
from rollout.termination import FORMAT_ERROR_KINDS


def run(coro):
    return asyncio.run(coro)


# ---- definitions and schemas --------------------------------------------------------------


def test_schema_renders_every_type_enum_default_and_optional():
    definition = ToolDefinition(
        "convert",
        "Convert a temperature.",
        [
            ToolParameter("text", "string", "Free text"),
            ToolParameter("value", "number", "Degrees"),
            ToolParameter("digits", "integer", "Rounding", required=False, default=1),
            ToolParameter("verbose", "boolean", required=False),
            ToolParameter("values", "array", "More values", items="number"),
            ToolParameter("options", "object", "Extra options", required=False),
            ToolParameter("unit", "string", "Target unit", enum=["C", "F", "K"]),
        ],
    )
    assert definition.to_openai_schema() == {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert a temperature.",
            "parameters": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "Free text"},
                    "value": {"type": "number", "description": "Degrees"},
                    "digits": {"type": "integer", "description": "Rounding", "default": 1},
                    "verbose": {"type": "boolean"},
                    "values": {"type": "array", "description": "More values", "items": {"type": "number"}},
                    "options": {"type": "object", "description": "Extra options"},
                    "unit": {"type": "string", "description": "Target unit", "enum": ["C", "F", "K"]},
                },
                "required": ["text", "value", "values", "unit"],
            },
        },
    }


def test_schema_of_a_tool_without_parameters():
    schema = ToolDefinition("now", "Current time").to_openai_schema()
    assert schema["function"]["parameters"] == {"type": "object", "properties": {}, "required": []}
    json.dumps(schema)


def test_definitions_reject_bad_types_duplicates_and_unknown_fields():
    with pytest.raises(ValidationError):
        ToolParameter("x", "str")
    with pytest.raises(ValidationError, match="twice"):
        ToolDefinition("t", parameters=[ToolParameter("x"), ToolParameter("x")])
    with pytest.raises(ValidationError):
        ToolParameter("x", colour="red")


def test_definitions_accept_dicts_and_pickle():
    definition = ToolDefinition(name="t", parameters=[{"name": "x", "type": "integer"}])
    assert definition.parameters[0] == ToolParameter("x", "integer")
    assert pickle.loads(pickle.dumps(definition)) == definition


def test_function_tool_takes_name_and_description_from_the_function():
    def word_count(text):
        """Count the words.

        Longer explanation nobody reads."""
        return len(text.split())

    made = FunctionTool(word_count, [ToolParameter("text")])
    assert (made.name, made.definition.description) == ("word_count", "Count the words.")

    @tool
    def ping():
        return "pong"

    assert isinstance(ping, Tool) and ping.definition.parameters == []


# ---- a registry to exercise -----------------------------------------------------------------


class Counter(Tool):
    """A subclassed tool with state."""

    definition = ToolDefinition(
        "count", "Add to a counter", [ToolParameter("by", "integer", required=False, default=1)]
    )

    def __init__(self):
        super().__init__()
        self.total = 0

    def execute(self, by):
        self.total += by
        return self.total


def make_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    @tool(parameters=[ToolParameter("a", "integer"), ToolParameter("b", "integer")])
    def divide(a, b):
        """Divide a by b."""
        return a / b

    @registry.register
    @tool(parameters=[ToolParameter("text", "string")])
    async def shout(text):
        await asyncio.sleep(0)
        return text.upper()

    @registry.register
    @tool(parameters=[ToolParameter("key", "string", enum=["a", "b"])])
    def lookup(key):
        return {"key": key, "values": [1, 2.5, None]}

    registry.register(Counter())
    return registry


def test_registry_lists_tools_in_order_and_renders_schemas():
    registry = make_registry()
    assert registry.names() == ["divide", "shout", "lookup", "count"]
    assert [s["function"]["name"] for s in registry.schemas()] == registry.names()
    assert registry.get_tool("divide").definition.description == "Divide a by b."
    assert registry.get_tool("nope") is None
    assert isinstance(registry, ToolExecutor)


def test_registering_a_name_twice_needs_replace():
    registry = make_registry()
    other = FunctionTool(lambda: "new", name="shout")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(other)
    registry.register(other, replace=True)
    assert registry.execute_tool("shout") == (True, "new")
    with pytest.raises(TypeError):
        registry.register(lambda: 1)


# ---- the three failure kinds, with their exact texts ----------------------------------------


FAILURES = [
    ("missing", {}, "Tool 'missing' not found", "unknown_tool"),
    ("divide", {"a": 1, "b": 0}, "Tool execution error: division by zero", "execution_error"),
    ("divide", {"a": 1}, "Invalid arguments for tool 'divide': missing required parameter 'b'", "invalid_arguments"),
]


@pytest.mark.parametrize("name, params, text, kind", FAILURES)
def test_execute_turns_failures_into_observations(name, params, text, kind):
    registry = make_registry()
    obs = run(registry.execute(Action(name=name, arguments=params, call_id="call_9")))
    assert (obs.success, obs.content, obs.info["error"]) == (False, text, kind)
    assert (obs.call_id, obs.action_name) == ("call_9", name)
    assert obs.info["duration"] >= 0
    assert (kind in FORMAT_ERROR_KINDS) == (kind != "execution_error")
    obs.model_dump_json()


@pytest.mark.parametrize("name, params, text, kind", FAILURES)
def test_execute_tool_gives_the_same_texts(name, params, text, kind):
    assert make_registry().execute_tool(name, **params) == (False, text)


def test_successful_calls_sync_async_and_subclassed():
    registry = make_registry()
    assert registry.execute_tool("divide", a=3, b=2) == (True, "1.5")
    assert registry.execute_tool("shout", text="hi") == (True, "HI")  # async tool, no loop running
    assert registry.execute_tool("count") == (True, "1")  # optional default filled in

    async def calls():
        return [
            await registry.execute(Action(name="shout", arguments={"text": "héllo"}, call_id="c1")),
            await registry.execute(Action(name="lookup", arguments={"key": "b"})),
            await registry.execute(Action(name="count", arguments={"by": 5})),
        ]

    shout, lookup, count = run(calls())
    assert (shout.success, shout.content, shout.call_id, shout.info.keys()) == (True, "HÉLLO", "c1", {"duration"})
    assert json.loads(lookup.content) == {"key": "b", "values": [1, 2.5, None]}
    assert count.content == "6"


def test_execute_tool_refuses_async_tools_inside_a_running_loop():
    async def inside():
        return make_registry().execute_tool("shout", text="x")

    ok, text = run(inside())
    assert not ok and text.startswith("Tool execution error: async tool 'shout'")


def test_results_become_text():
    class Opaque:
        def __str__(self):
            return "<opaque>"

    outputs = {"str": "plain", "none": None, "obj": Opaque(), "surrogate": "bad \ud800 char", "nan": math.nan}
    registry = ToolRegistry([FunctionTool(lambda v=k: outputs[v], name=k) for k in outputs])
    got = {k: registry.execute_tool(k)[1] for k in outputs}
    assert got == {"str": "plain", "none": "null", "obj": "<opaque>", "surrogate": "bad \ufffd char", "nan": "NaN"}


def test_threaded_tool_does_not_block_the_event_loop():
    released = threading.Event()

    def wait_for_loop():
        # Only returns "free" if the event loop kept running while this call blocked.
        return "free" if released.wait(timeout=10) else "blocked"

    registry = ToolRegistry([FunctionTool(wait_for_loop, run_in_thread=True)])

    async def main():
        pending = asyncio.create_task(registry.execute(Action(name="wait_for_loop")))
        await asyncio.sleep(0.01)
        released.set()
        return await pending

    assert run(main()).content == "free"


def test_timeouts_and_thread_errors_are_execution_errors():
    async def forever():
        await asyncio.sleep(60)

    def boom():
        raise RuntimeError("disk on fire")

    registry = ToolRegistry([FunctionTool(forever, timeout=0.05), FunctionTool(boom, run_in_thread=True)])
    slow = run(registry.execute(Action(name="forever")))
    assert (slow.success, slow.content, slow.info["error"]) == (
        False,
        "Tool execution error: timed out after 0.05s",
        "execution_error",
    )
    broken = run(registry.execute(Action(name="boom")))
    assert broken.content == "Tool execution error: disk on fire"


@pytest.mark.parametrize(
    "error", [Submitted("done", submission="42"), RuntimeFailure("container died"), ModelError("x")]
)
@pytest.mark.parametrize("threaded", [False, True])
def test_outcomes_and_infrastructure_errors_propagate(error, threaded):
    def raise_it():
        raise error

    registry = ToolRegistry([FunctionTool(raise_it, run_in_thread=threaded)])
    with pytest.raises(type(error)):
        run(registry.execute(Action(name="raise_it")))


# ---- argument validation ------------------------------------------------------------------


def one(kind, **extra):
    return ToolRegistry([FunctionTool(lambda **kw: kw, [ToolParameter("p", kind, **extra)], name="t")])


@pytest.mark.parametrize(
    "kind, extra, value, coerced",
    [
        ("integer", {}, 3, 3),
        ("integer", {}, -(10**30), -(10**30)),
        ("number", {}, 2, 2.0),
        ("number", {}, 2.5, 2.5),
        ("boolean", {}, False, False),
        ("string", {}, "", ""),
        ("array", {}, [1, "a"], [1, "a"]),
        ("array", {"items": "number"}, [1, 2.5], [1.0, 2.5]),
        ("object", {}, {"k": [1]}, {"k": [1]}),
        ("string", {"enum": ["x", "y"]}, "y", "y"),
        ("integer", {"enum": [1, 2]}, 2, 2),
        ("number", {"enum": [1.5, 3]}, 3, 3.0),
    ],
)
def test_valid_values(kind, extra, value, coerced):
    ok, error, params = one(kind, **extra).validate("t", {"p": value})
    assert (ok, error, params) == (True, "", {"p": coerced})
    assert type(params["p"]) is type(coerced)


@pytest.mark.parametrize(
    "kind, extra, value, problem",
    [
        ("integer", {}, 1.5, "parameter 'p' must be an integer, got 1.5"),
        ("integer", {}, 2.0, "parameter 'p' must be an integer, got 2.0"),
        ("integer", {}, True, "parameter 'p' must be an integer, got true"),
        ("integer", {}, "3", "parameter 'p' must be an integer, got \"3\""),
        ("number", {}, True, "parameter 'p' must be a number, got true"),
        ("number", {}, "2.5", "parameter 'p' must be a number, got \"2.5\""),
        ("number", {}, math.inf, "parameter 'p' must be a finite number, got Infinity"),
        ("number", {}, 10**400, "parameter 'p' must be a number in floating-point range"),
        ("boolean", {}, 1, "parameter 'p' must be a boolean, got 1"),
        ("boolean", {}, "true", "parameter 'p' must be a boolean, got \"true\""),
        ("string", {}, 5, "parameter 'p' must be a string, got 5"),
        ("string", {}, None, "parameter 'p' must be a string, got null"),
        ("array", {}, "a,b", "parameter 'p' must be an array, got \"a,b\""),
        ("array", {"items": "integer"}, [1, 2.5], "parameter 'p' item 2 must be an integer, got 2.5"),
        ("object", {}, [], "parameter 'p' must be an object, got []"),
        ("string", {"enum": ["x", "y"]}, "z", 'parameter \'p\' must be one of "x", "y", got "z"'),
        ("integer", {"enum": [1, 2]}, 3, "parameter 'p' must be one of 1, 2, got 3"),
        ("boolean", {"enum": [True]}, False, "parameter 'p' must be one of true, got false"),
    ],
)
def test_invalid_values(kind, extra, value, problem):
    ok, error, params = one(kind, **extra).validate("t", {"p": value})
    assert not ok and params == {}
    assert error.startswith(f"Invalid arguments for tool 't': {problem}")


def test_enum_of_integers_does_not_take_booleans():
    ok, error, _ = one("integer", enum=[0, 1]).validate("t", {"p": True})
    assert not ok and "must be an integer" in error


def test_unknown_missing_and_several_problems_are_all_reported():
    registry = make_registry()
    ok, error, _ = registry.validate("divide", {"a": "1", "c": 2})
    assert not ok
    assert error == (
        "Invalid arguments for tool 'divide': unknown parameter 'c' (parameters: a, b); "
        "parameter 'a' must be an integer, got \"1\"; missing required parameter 'b'"
    )
    assert registry.validate("nope", {}) == (False, "Tool 'nope' not found", {})
    assert (
        registry.validate("divide", ["a"])[1]
        == "Invalid arguments for tool 'divide': arguments must be a JSON object, got [\"a\"]"
    )


def test_optional_parameters_null_and_defaults():
    registry = ToolRegistry(
        [
            FunctionTool(
                lambda **kw: kw,
                [
                    ToolParameter("q", "string"),
                    ToolParameter("limit", "integer", required=False, default=10),
                    ToolParameter("tag", "string", required=False),
                ],
                name="search",
            )
        ]
    )
    assert registry.validate("search", {"q": "x"}) == (True, "", {"q": "x", "limit": 10})
    assert registry.validate("search", {"q": "x", "limit": None, "tag": None}) == (True, "", {"q": "x", "limit": 10})
    assert registry.validate("search", {"q": "x", "limit": 3, "tag": "t"})[2] == {"q": "x", "limit": 3, "tag": "t"}
    assert (
        registry.validate("search", {"limit": 3})[1]
        == "Invalid arguments for tool 'search': missing required parameter 'q'"
    )
