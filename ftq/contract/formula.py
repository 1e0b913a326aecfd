"""A `multi` grader's `calculate_output`: parsed with `ast` and evaluated by walking an allow-listed set of
nodes (numbers, the sub-graders' names, + - * / **, unary -, comparisons, and the calls min, max, abs,
sqrt, log, exp), never `eval`. Anything else (attributes, subscripts, other calls, `__import__`) is
refused when the grader is validated."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any


class FormulaError(ValueError):
    """A formula that is not allowed, or that cannot be evaluated (division by zero, a domain error)."""


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_COMPARE: dict[type[ast.cmpop], Callable[[float, float], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "sqrt": math.sqrt,
    "log": math.log,
    "exp": math.exp,
}
# A bound on `**`, so that `10 ** 10 ** 10` is refused rather than computed.
_MAX_EXPONENT = 1000.0


def _parse(formula: str) -> ast.expr:
    try:
        return ast.parse(formula, mode="eval").body
    except SyntaxError as e:
        raise FormulaError(f"not a formula: {e.msg}") from None


def check(formula: str, names: set[str]) -> None:
    """Refuse a formula with a node outside the allow-list, or a name that is no sub-grader."""
    _walk(_parse(formula), names, None)


def evaluate(formula: str, values: Mapping[str, float]) -> float:
    """The formula's value with each sub-grader's name bound to its score."""
    try:
        return float(_walk(_parse(formula), set(values), values))
    except (ZeroDivisionError, OverflowError, ValueError) as e:
        if isinstance(e, FormulaError):
            raise
        raise FormulaError(f"cannot evaluate: {e}") from None


def _walk(node: ast.expr, names: set[str], values: Mapping[str, float] | None) -> Any:
    """Check (values None) or evaluate one node."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise FormulaError(f"only numbers are allowed, not {node.value!r}")
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise FormulaError(f"{node.id!r} names no sub-grader (graders: {', '.join(sorted(names))})")
        return None if values is None else values[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left, names, values), _walk(node.right, names, values)
        if values is None:
            return None
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise FormulaError(f"exponent {right} is too large")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, complex):
            raise FormulaError(f"{left} ** {right} is not a real number")
        return value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _walk(node.operand, names, values)
        return None if values is None else (-operand if isinstance(node.op, ast.USub) else operand)
    if isinstance(node, ast.Compare):
        operands = [_walk(node.left, names, values)] + [_walk(c, names, values) for c in node.comparators]
        for op in node.ops:
            if type(op) not in _COMPARE:
                raise FormulaError(f"the comparison {type(op).__name__} is not allowed")
        if values is None:
            return None
        ok = all(_COMPARE[type(op)](a, b) for op, a, b in zip(node.ops, operands, operands[1:], strict=False))
        return 1.0 if ok else 0.0
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            raise FormulaError(f"only the calls {', '.join(_FUNCTIONS)} are allowed")
        if node.keywords or not node.args:
            raise FormulaError(f"{node.func.id}() takes one or more positional numbers")
        args = [_walk(a, names, values) for a in node.args]
        return None if values is None else _FUNCTIONS[node.func.id](*args)
    raise FormulaError(f"{type(node).__name__} is not allowed in a formula")
