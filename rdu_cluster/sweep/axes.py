"""Axes (grid, zip, list) and filters, and their expansion into points.

A sweep is the cartesian product of its axes: a grid axis is itself the product of its fields'
value lists, a zip axis walks its lists in step, a list axis names its points one by one. The
product is counted before it is built, so a spec of 10^12 points fails at once, and filters then
keep (`filters`) or drop (`drop`) combinations.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workloads.errors import ConfigError


@dataclass(frozen=True)
class Axis:
    """`kind` grid | zip: `fields` and one value list per field; list: `points`."""

    kind: str
    where: str  # "axes[2]", for messages
    fields: tuple[str, ...] = ()
    values: tuple[tuple[Any, ...], ...] = ()
    points: tuple[Mapping[str, Any], ...] = ()

    @property
    def size(self) -> int:
        if self.kind == "grid":
            return math.prod(len(v) for v in self.values)
        if self.kind == "zip":
            return len(self.values[0])
        return len(self.points)

    def names(self) -> set[str]:
        return set(self.fields) | {k for p in self.points for k in p}

    def assignments(self) -> Iterator[dict[str, Any]]:
        """Partial scenarios, in a fixed order (row-major for a grid: the last field fastest)."""
        if self.kind == "grid":
            for combo in itertools.product(*self.values):
                yield dict(zip(self.fields, combo))
        elif self.kind == "zip":
            for combo in zip(*self.values):
                yield dict(zip(self.fields, combo))
        else:
            for p in self.points:
                yield dict(p)

    def describe(self) -> str:
        if self.kind == "list":
            return f"list({len(self.points)} points)"
        sep = " x " if self.kind == "grid" else ", "
        inner = sep.join(f"{f}[{len(v)}]" for f, v in zip(self.fields, self.values))
        return f"{self.kind}({inner})"


_ALLOWED_NODES = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.UAdd,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Pow,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.In,
    ast.NotIn,
    ast.Is,
    ast.IsNot,
    ast.IfExp,
    ast.Constant,
    ast.Tuple,
    ast.List,
    ast.Load,
    ast.Name,
    ast.Attribute,
    ast.Call,
)


def _round(x: Any, digits: Any = None) -> Any:
    """round(x[, digits]) with |digits| <= 30: an int rounded to -10**9 digits builds 10**10**9."""
    if digits is not None and not (isinstance(digits, int) and abs(digits) <= 30):
        raise ValueError(f"round: digits must be an integer in [-30, 30], got {digits!r:.30}")
    return round(x) if digits is None else round(x, digits)


_FUNCTIONS = {"min": min, "max": max, "abs": abs, "round": _round}

# Bounds of a filter, so a spec cannot make the expansion hang or exhaust memory (9**9**9**9,
# [0] * 10**11, 20,000 chained terms). Real filters are a line or two: "batch * (prompt_len +
# gen_len) <= 2**20". Every arithmetic operator runs through _arith, which admits numbers only
# (no sequence repetition or concatenation) and refuses results past 2^_MAX_BITS.
MAX_FILTER_CHARS = 1000
MAX_FILTER_NODES = 300
_MAX_BITS = 1024
_MAX_CONSTANT = 10**18


def _arith(op: str, a: Any, b: Any) -> Any:
    for x in (a, b):
        if not isinstance(x, (int, float)):
            raise TypeError(f"{op} takes numbers, got {type(x).__name__}")
    if op == "**" and isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1 \
            and a.bit_length() * b > _MAX_BITS:
        raise OverflowError(f"{a} ** {b} exceeds 2^{_MAX_BITS}")
    out = _BINOPS[op](a, b)
    if isinstance(out, int) and out.bit_length() > _MAX_BITS:
        raise OverflowError(f"result exceeds 2^{_MAX_BITS}")
    return out


_BINOPS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b, "//": lambda a, b: a // b, "%": lambda a, b: a % b,
    "**": lambda a, b: a**b,
}
_OP_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
              ast.Mod: "%", ast.Pow: "**"}


@dataclass(frozen=True)
class Filter:
    """A boolean expression over scenario fields (dotted names allowed: chip.tiers.hbm.x).
    Only arithmetic, comparisons, boolean logic and min/max/abs/round: no attribute access, no
    calls to anything else, so a spec cannot run code."""

    text: str
    where: str
    drop: bool  # True: drop the points where it holds; False: keep only those
    names: tuple[str, ...]  # the dotted field names it reads, in the order of `code`'s arguments
    code: Any

    def keeps(self, fields: Mapping[str, Any]) -> bool:
        env = {f"_f{i}": fields.get(n) for i, n in enumerate(self.names)}
        env.update(_FUNCTIONS)
        env["_arith"] = _arith
        try:
            holds = bool(eval(self.code, {"__builtins__": {}}, env))
        except (TypeError, ValueError, ArithmeticError) as e:  # e.g. None > 8, 1 / 0
            shown = {n: fields.get(n) for n in self.names}
            raise ConfigError(
                f"{self.where}: {self.text!r} fails at {shown}: {type(e).__name__}: {e}"
            ) from None
        return holds != self.drop


def compile_filter(text: Any, where: str, drop: bool, known) -> Filter:
    """`known(name)` says whether a dotted field name exists for the spec's kind."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: expected an expression string, got {text!r:.60}")
    if len(text) > MAX_FILTER_CHARS:
        raise ConfigError(f"{where}: {len(text):,} characters; a filter may have at most "
                          f"{MAX_FILTER_CHARS:,}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError, ValueError) as e:
        why = e.msg if isinstance(e, SyntaxError) else "nested too deeply"
        raise ConfigError(f"{where}: {text!r}: not an expression ({why})") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_FILTER_NODES:
        raise ConfigError(f"{where}: {len(nodes):,} terms; a filter may have at most "
                          f"{MAX_FILTER_NODES}")
    for node in nodes:
        if not isinstance(node, _ALLOWED_NODES):
            raise ConfigError(f"{where}: {text!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords
        ):
            raise ConfigError(f"{where}: {text!r}: only min, max, abs, round may be called")
        _check_constant(node, where, text)
    names: list[str] = []
    tree = _DottedNames(names, where, text).visit(tree)
    for name in names:
        if not known(name):
            raise ConfigError(f"{where}: {text!r}: {name}: unknown field")
    code = compile(ast.fix_missing_locations(tree), where, "eval")
    return Filter(text, where, drop, tuple(names), code)


class _DottedNames(ast.NodeTransformer):
    """Replaces each field name (a.b.c) by a local `_fN` so eval never does attribute access."""

    def __init__(self, names: list[str], where: str, text: str):
        self.names, self.where, self.text = names, where, text

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        """a OP b -> _arith("OP", a, b): numbers only, results bounded."""
        args = [ast.Constant(_OP_SYMBOL[type(node.op)]), self.visit(node.left),
                self.visit(node.right)]
        return ast.Call(func=ast.Name(id="_arith", ctx=ast.Load()), args=args, keywords=[])

    def visit_Call(self, node: ast.Call) -> ast.AST:
        node.args = [self.visit(a) for a in node.args]
        return node  # the function name stays a plain Name (checked against _FUNCTIONS)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        return self._local(_dotted(node, self.where, self.text))

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("True", "False", "None"):
            return ast.Constant({"True": True, "False": False, "None": None}[node.id])
        return self._local(node.id)

    def _local(self, name: str) -> ast.Name:
        if name not in self.names:
            self.names.append(name)
        return ast.Name(id=f"_f{self.names.index(name)}", ctx=ast.Load())


def _check_constant(node: ast.AST, where: str, text: str) -> None:
    if not isinstance(node, ast.Constant):
        return
    v = node.value
    big = isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > _MAX_CONSTANT
    if big or (isinstance(v, str) and len(v) > 256) or isinstance(v, (bytes, complex)):
        raise ConfigError(f"{where}: {text[:60]!r}: constant {str(v)[:30]} out of bounds; "
                          f"numbers up to 1e18, strings up to 256 characters")


def _dotted(node: ast.AST, where: str, text: str) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise ConfigError(f"{where}: {text!r}: only field names may be dotted")
    return ".".join([node.id, *reversed(parts)])


def grid_size(axes: Sequence[Axis]) -> int:
    return math.prod(a.size for a in axes)


def point_id(kind: str, fields: Mapping[str, Any]) -> str:
    """A point's id: a hash of its canonical scenario (kind and every set field, sorted)."""
    return hashlib.sha256(canonical({"kind": kind, **fields}).encode()).hexdigest()[:20]


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def combinations(base: Mapping[str, Any], axes: Sequence[Axis]) -> Iterator[dict[str, Any]]:
    """Every scenario of the product, in a fixed order: base values overlaid with each axis's."""
    for parts in itertools.product(*(list(a.assignments()) for a in axes)):
        fields = dict(base)
        for part in parts:
            fields.update(part)
        yield fields
