"""The demo's tools: course outline, course content search, and a safe calculator."""

from __future__ import annotations

import ast
import operator

from agents.demo import catalog
from agents.tools.registry import ToolRegistry
from agents.tools.tool import FunctionTool, ToolParameter

_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / // % ** and parentheses)."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            right = ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](ev(node.left), right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression element: {type(node).__name__}")

    value = ev(ast.parse(expression, mode="eval"))
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def get_course_outline(course_title: str) -> str:
    """The numbered lessons of a course."""
    return catalog.course_outline(course_title)


def search_course_content(query: str, exclude_course: str | None = None) -> str:
    """Lessons of any course whose title contains the query."""
    return catalog.search_content(query, exclude_course)


def demo_tools(task=None) -> ToolRegistry:
    return ToolRegistry(
        [
            FunctionTool(get_course_outline, [ToolParameter("course_title", "string", "Exact course title")]),
            FunctionTool(
                search_course_content,
                [
                    ToolParameter("query", "string", "Words to look for in lesson titles"),
                    ToolParameter("exclude_course", "string", "A course to leave out", required=False),
                ],
            ),
            FunctionTool(calculate, [ToolParameter("expression", "string", "e.g. (17 * 23) + 4")]),
        ]
    )
