"""Arithmetic tasks with a ``calculator`` tool and a verifiable reward, as a NeMo-Gym-style resources server.

``POST /calculator {"expression": "..."}`` answers ``{"expression", "result"}`` or, for a bad expression,
``{"expression", "error"}`` (still 200: the model reads it). A row with ``fail_tool: true`` makes the tool of that
session answer HTTP 500 with a text body. ``POST /verify`` gives reward 1.0 when the final number in the last
assistant message equals the row's ``expected_answer``. ``calc_rows(n, seed)`` makes rows of graded difficulty.

``python -m envs.resources.calc_server --port N [--host H]`` serves it;
``python -m envs.resources.calc_server --rows N [--seed S]`` prints N rows as JSONL."""

from __future__ import annotations

import argparse
import ast
import json
import math
import operator
import random
import re
import sys
from fractions import Fraction
from typing import Any, Optional, Union

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from envs.resources.serving import serve_forever
from envs.resources.sessions import Problem, ResourcesServer, Session, build_app, output_items

Number = Union[int, float]
MAX_EXPRESSION_CHARS = 500
MAX_MAGNITUDE = 10 ** 300
INJECTED_FAILURE = "calculator unavailable: injected failure (the row sets fail_tool)"

CALCULATOR_TOOL = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses; returns the result.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "for example (17 + 25) * 3"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
    "strict": True,
}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
# a number that stands alone: not part of a word, a version string or a bigger number; commas group thousands
_NUMBER = re.compile(r"(?<![\w.,])[-\u2212]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w)")


class CalcError(ValueError):
    """An expression the calculator refuses; the message is shown to the model."""


def _check(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalcError("the result is too large")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > 1000 or (abs(base) > 1 and abs(exponent) * math.log10(abs(base)) > 300):
        raise CalcError("the power is too large")
    if base == 0 and exponent < 0:
        raise CalcError("division by zero")
    result = base ** exponent
    if isinstance(result, complex):
        raise CalcError("a negative number to a fractional power has no real value")
    return result


def _evaluate(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check(_power(left, right))
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalcError("division by zero")
        return _check(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise CalcError("^ is not a power here: write ** (for example 2 ** 10)")
    raise CalcError(f"only numbers, + - * / // % ** and parentheses are allowed, not {ast.unparse(node)!r}")


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression, parsed with ``ast`` (never ``eval``); ``CalcError`` if refused."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise CalcError(f"syntax error: {error.msg}") from None
    except ValueError as error:  # e.g. a NUL byte
        raise CalcError(f"syntax error: {error}") from None
    try:
        value = _evaluate(tree.body)
    except (OverflowError, RecursionError, MemoryError):
        raise CalcError("the result is too large") from None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return int(value)
    return value


def final_number(text: str) -> Optional[Fraction]:
    """The last number standing alone in ``text`` (``1,234`` and ``-5`` count; ``v2`` and the ``5`` of ``3-5``
    as a negative do not), exactly, or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return Fraction(found[-1].replace(",", "").replace("\u2212", "-"))
    except (ValueError, ZeroDivisionError):
        return None


def message_text(item: dict) -> str:
    """The text of a ``message`` item: its string content, or its ``output_text``/``input_text`` parts joined."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "\n".join(part["text"] for part in parts if isinstance(part, dict) and isinstance(part.get("text"), str)
                     and part.get("type") in ("output_text", "input_text", "text"))


def _expected(body: dict) -> Fraction:
    value = body.get("expected_answer")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise Problem(422, "`expected_answer` must be a number")
    try:
        return Fraction(str(value).replace(",", ""))
    except (ValueError, ZeroDivisionError):
        raise Problem(422, f"`expected_answer` {value!r} is not a number") from None


def grade(body: dict) -> dict:
    """Reward 1.0 when the final number of the last assistant message equals ``expected_answer``."""
    items = output_items(body)
    want = _expected(body)
    messages = [item for item in items if item["type"] == "message" and item.get("role", "assistant") == "assistant"]
    got = final_number(message_text(messages[-1])) if messages else None
    ok = got is not None and abs(got - want) <= Fraction(1, 10 ** 9) * max(1, abs(want))
    shown = float(got) if got is not None and abs(got) < MAX_MAGNITUDE else None
    return {"reward": 1.0 if ok else 0.0, "extracted_answer": shown}


class CalcServer(ResourcesServer):
    """The calculator tool; a session remembers whether its row injects a tool failure."""

    def new_state(self, row: dict) -> dict:
        return {"fail_tool": row.get("fail_tool") is True}

    def tools(self) -> dict:
        return {"calculator": self.calculator}

    async def calculator(self, session: Optional[Session], arguments: Any) -> Any:
        if session is not None and session.state["fail_tool"]:
            return PlainTextResponse(INJECTED_FAILURE, status_code=500)
        expression = arguments.get("expression") if isinstance(arguments, dict) else None
        if not isinstance(expression, str):
            return {"expression": expression, "error": 'call calculator with {"expression": "<arithmetic>"}'}
        try:
            return {"expression": expression, "result": evaluate(expression)}
        except CalcError as error:
            return {"expression": expression, "error": str(error)}

    async def verify(self, body: dict, session: Optional[Session]) -> dict:
        return grade(body)


def create_app() -> FastAPI:
    """The calculator resources server as an ASGI app."""
    return build_app(CalcServer(), title="calculator resources server")


def _problem(rng: random.Random, level: int) -> str:
    r = rng.randint
    if level == 1:
        return f"{r(10, 99)} {rng.choice('+-')} {r(10, 99)}"
    if level == 2:
        return f"{r(12, 99)} * {r(12, 999)}"
    if level == 3:
        return f"({r(10, 999)} + {r(10, 999)}) * {r(3, 49)} - {r(100, 9999)}"
    divisor, quotient = r(3, 29), r(11, 999)
    numerator = divisor * quotient
    factor = r(11, min(97, numerator))
    return (f"({factor} * {numerator // factor} + {numerator % factor}) / {divisor}"
            f" - {r(2, 19)} ** {r(2, 3)}")


def calc_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` NeMo-Gym rows, easiest first (levels 1-4: a sum, a product, mixed operations, division and a power)."""
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        level = 1 + (4 * index) // max(n, 1)
        expression = _problem(rng, level)
        prompt = (f"Compute {expression}. Use the calculator tool, then end your reply with the result "
                  f"as the last number you write.")
        rows.append({
            "responses_create_params": {"input": [{"role": "user", "content": prompt}], "tools": [CALCULATOR_TOOL]},
            "expected_answer": evaluate(expression),
            "task_id": f"calc-{seed}-{index:05d}",
            "difficulty": level,
        })
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    summary = __doc__.split("\n")[0].replace("``", "")  # the help shows plain text, not RST markup
    parser = argparse.ArgumentParser(prog="python -m envs.resources.calc_server", description=summary)
    parser.add_argument("--port", type=int, help="serve on this port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--rows", type=int, help="print this many rows as JSONL instead of serving")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.rows is not None:
        for row in calc_rows(args.rows, args.seed):
            sys.stdout.write(json.dumps(row) + "\n")
        return 0
    if args.port is None:
        parser.error("give --port to serve, or --rows to print rows")
    serve_forever(create_app(), args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
