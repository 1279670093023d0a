"""Action parsers: turn a model message into actions or raise FormatError."""

from agents.parsers.bash_block import BashBlockConfig, BashBlockParser
from agents.parsers.function_calls import FunctionCallsConfig, FunctionCallsParser
from agents.parsers.json_action import JSONActionConfig, JSONActionParser
from agents.parsers.openai_tools import OpenAIToolsConfig, OpenAIToolsParser
from agents.parsers.react import ReActConfig, ReActParser

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
