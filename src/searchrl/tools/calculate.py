"""`calculate`: arithmetic and comparisons on numbers and ISO dates, from the model's text.

Never `eval`: the expression is parsed by `ast.parse(mode="eval")` and walked by an evaluator
that knows a short allow-list of nodes (numbers, dates, + - * / // % **, unary minus,
comparisons, abs / round / min / max / sqrt); any other node — a name, an attribute, a call of
anything else, a lambda, a comprehension, a string — is refused before anything is computed.
Work is bounded: the text's length, the tree's size and depth, exponents and integer sizes
(`9**9**9` is refused, not computed), and a wall-clock deadline checked at every node.
"""

from __future__ import annotations

import ast
import datetime
import math
import operator
import re
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from searchrl.tools.base import Observation, Tool
from searchrl.tools.registry import TOOLS

MAX_CHARS = 300
MAX_NODES = 200
MAX_DEPTH = 30
MAX_INT_BITS = 3400  # ~1000 decimal digits
DEADLINE_S = 0.05
# A date literal: 2020-03-01, not inside a longer number or name.
_DATE = re.compile(r"(?<![\w.])(\d{4})-(\d{2})-(\d{2})(?![\w.])")
_DATE_NAME = "date_"
_ALLOWED = "numbers, dates (YYYY-MM-DD), + - * / // % **, parentheses, comparisons and abs, round, min, max, sqrt"
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.Eq: operator.eq, ast.NotEq: operator.ne}


def _round(x, digits=0):
    if not isinstance(digits, int) or abs(digits) > 20:
        raise CalcError("round takes a whole number of digits, at most 20")
    return round(x, digits) if digits else round(x)


_FUNCTIONS = {"abs": (abs, 1, 1), "round": (_round, 1, 2), "min": (min, 2, 20), "max": (max, 2, 20),
              "sqrt": (math.sqrt, 1, 1)}
_CONSTANTS = {"pi": math.pi, "e": math.e}


class CalcError(Exception):
    """An expression that is not computed; the message is the model's to read."""


def calculate(expression: str) -> str:
    """The value of `expression` as text; `CalcError` says why there is none.

    >>> calculate("(2 + 3) * 4 ** 2 / 8"), calculate("2020-03-01 - 1999-12-31"), calculate("1.5e3 >= 1500")
    ('10', '7366', 'true')
    """
    if len(expression) > MAX_CHARS:
        raise CalcError(f"the expression is {len(expression)} characters long; at most {MAX_CHARS} are read")
    dates: dict[str, datetime.date] = {}

    def date_name(m: re.Match) -> str:
        try:
            day = datetime.date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            raise CalcError(f"{m[0]} is not a date") from None
        dates[f"{_DATE_NAME}{len(dates)}"] = day
        return f"{_DATE_NAME}{len(dates) - 1}"

    source = _DATE.sub(date_name, expression)
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError(f"cannot read the expression; write {_ALLOWED}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalcError(f"the expression is too long; at most {MAX_NODES} parts")
    value = _Evaluator(dates).run(tree.body)
    return _shown(value)


class _Evaluator:
    def __init__(self, dates: dict[str, datetime.date]) -> None:
        self.dates, self.deadline = dates, time.perf_counter() + DEADLINE_S

    def run(self, node: ast.AST) -> Any:
        try:
            return self.value(node, 0)
        except CalcError:
            raise
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        except OverflowError:
            raise CalcError("the result is too large") from None
        except (TypeError, ValueError) as exc:  # a date times a number, sqrt(-1), ...
            raise CalcError(_type_message(exc)) from None

    def value(self, node: ast.AST, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise CalcError(f"the expression nests too deep; at most {MAX_DEPTH} levels")
        if time.perf_counter() > self.deadline:
            raise CalcError("the expression takes too long to compute")
        depth += 1
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self.checked(node.value)
        if isinstance(node, ast.Name) and (node.id in self.dates or node.id in _CONSTANTS):
            return self.dates.get(node.id, _CONSTANTS.get(node.id))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = self.number(node.operand, depth)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self.binary(node.op, self.value(node.left, depth), self.value(node.right, depth))
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            values = [self.value(v, depth) for v in (node.left, *node.comparators)]
            return all(_COMPARE[type(op)](a, b) for op, a, b in zip(node.ops, values, values[1:]))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
            function, least, most = _FUNCTIONS[node.func.id]
            if not least <= len(node.args) <= most or any(isinstance(a, ast.Starred) for a in node.args):
                raise CalcError(f"{node.func.id} takes {least}" + (f" to {most}" if most > least else "") + " numbers")
            return self.checked(function(*(self.number(a, depth) for a in node.args)))
        raise CalcError(f"`{_source(node)}` is not allowed; write {_ALLOWED}")

    def number(self, node: ast.AST, depth: int) -> int | float:
        value = self.value(node, depth)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise CalcError(f"`{_source(node)}` is not a number")
        return value

    def binary(self, op: ast.operator, a: Any, b: Any) -> Any:
        if isinstance(a, bool) or isinstance(b, bool):
            raise CalcError("a comparison's true or false is no number")
        if isinstance(a, datetime.date) or isinstance(b, datetime.date):
            return _date_arithmetic(op, a, b)
        if isinstance(op, ast.Pow):
            _check_power(a, b)
        return self.checked(_BINARY[type(op)](a, b))

    @staticmethod
    def checked(value: Any) -> Any:
        if isinstance(value, complex):
            raise CalcError("the result is not a real number")
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise CalcError("the result is too large")
        if isinstance(value, float) and not math.isfinite(value):
            raise CalcError("the result is too large" if math.isinf(value) else "the result is not a number")
        return value


def _check_power(base: float, exponent: float) -> None:
    # |base| ** exponent has about exponent * log2|base| bits: refuse before computing it.
    if abs(base) in (0, 1) or exponent <= 0:
        return
    if exponent * math.log2(abs(base)) > MAX_INT_BITS:
        raise CalcError("the result is too large")


def _date_arithmetic(op: ast.operator, a: Any, b: Any) -> Any:
    if isinstance(op, ast.Sub) and isinstance(a, datetime.date) and isinstance(b, datetime.date):
        return (a - b).days
    if isinstance(op, (ast.Add, ast.Sub)) and isinstance(a, datetime.date) and type(b) is int:
        return a + datetime.timedelta(days=b if isinstance(op, ast.Add) else -b)
    if isinstance(op, ast.Add) and type(a) is int and isinstance(b, datetime.date):
        return b + datetime.timedelta(days=a)
    raise CalcError("dates take only date - date (days between them) and date + or - a whole number of days")


def _type_message(exc: Exception) -> str:
    text = str(exc)
    if "datetime.date" in text:
        return "a date compares only with a date"
    if "math domain error" in text:
        return "sqrt of a negative number"
    return text


def _source(node: ast.AST) -> str:
    text = re.sub(rf"{_DATE_NAME}\d+", "<date>", ast.unparse(node))
    return text if len(text) <= 40 else text[:37] + "..."


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, float):
        return format(value, ".12g")
    return str(value)


@TOOLS.register("calculate")
class Calculate(Tool):
    name = "calculate"
    timeout_s = None  # built in: its requests have deadlines of their own
    description = ("Compute arithmetic or a comparison, e.g. `(3.5 + 2) * 4`, `2 ** 10 > 1000`, `sqrt(2)`; "
                   "dates as YYYY-MM-DD: `2020-03-01 - 1999-12-31` is the days between them.")
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "The expression to compute.", "maxLength": MAX_CHARS}},
        "required": ["expression"],
    }

    def call(self, calls: Sequence[dict[str, Any]]) -> list[Observation]:
        out = []
        for c in calls:
            t0 = time.perf_counter()
            try:
                out.append(Observation(calculate(c["expression"])))
            except CalcError as exc:
                out.append(Observation(f"calculate: {exc}", ok=False, error="bad_expression"))
            out[-1].latency_s = time.perf_counter() - t0
        return out
