"""Tools: typed definitions rendered to OpenAI schemas, and the registry that runs them."""

from agents.tools.registry import ToolRegistry, format_result
from agents.tools.tool import FunctionTool, Tool, ToolDefinition, ToolParameter, tool
from agents.tools.validation import check_arguments

__all__ = [
    "FunctionTool",
    "Tool",
    "ToolDefinition",
    "ToolParameter",
    "ToolRegistry",
    "check_arguments",
    "format_result",
    "tool",
]
