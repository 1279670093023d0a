"""Action parsers: turn a model message into actions or raise FormatError."""

from agents.parsers.bash_block import BashBlockConfig, BashBlockParser
from agents.parsers.function_calls import FunctionCallsConfig, FunctionCallsParser
from agents.parsers.json_action import JSONActionConfig, JSONActionParser
from agents.parsers.openai_tools import OpenAIToolsConfig, OpenAIToolsParser
from agents.parsers.react import ReActConfig, ReActParser
from agents.registry import PARSERS
from rollout.errors import ConfigError

__all__ = [
    "BashBlockConfig",
    "BashBlockParser",
    "FunctionCallsConfig",
    "FunctionCallsParser",
    "JSONActionConfig",
    "JSONActionParser",
    "OpenAIToolsConfig",
    "OpenAIToolsParser",
    "ReActConfig",
    "ReActParser",
]


def load_parser(name: str, options: dict | None = None, field: str = "agent.parser"):
    """The parser a config names (short name or dotted path), built with its options."""
    cls = PARSERS.load(name, field=field)
    try:
        return cls(**(options or {}))
    except ConfigError as exc:
        raise ConfigError(exc.message, f"{field}_options.{exc.field.split('.', 1)[-1]}") from None
