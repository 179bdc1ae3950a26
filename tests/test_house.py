"""The house rules issue 36 set, kept: no class over 400 lines in any source package; no function
over 80 lines or 8 parameters where the cost and the engine live (partitioning/,
rdu_cluster/engine/, rdu_cluster/scenarios/). A long function is split where it is long. And no
module over 700 lines in any source package: a module is one concept, and the ones that had
grown to 800-1,100 lines (capacity, the disaggregated engine, the prefix cache, the cost tables,
the sweep runners, the report's figures, the HF config importer) held several."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("chip", "interconnect", "partitioning", "workloads", "rdu_cluster", "cluster_configs")
STRICT = ("partitioning", "rdu_cluster/engine", "rdu_cluster/scenarios")
MAX_CLASS_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 400, 80, 8
MAX_MODULE_LINES = 700


@pytest.fixture(scope="module")
def nodes() -> dict[str, tuple[ast.AST, ...]]:
    """Each source file's classes and functions (at any depth), parsed and walked once for both
    tests (the strict folders lie inside PACKAGES; tests/conftest.py runs a module fixture's
    readers on one xdist worker)."""
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    out = {}
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            out[path.relative_to(ROOT).as_posix()] = tuple(
                n for n in ast.walk(tree) if isinstance(n, kinds))
    return out


def _nodes(nodes, folders):
    for path, found in nodes.items():
        if any(path.startswith(f"{folder}/") for folder in folders):
            for node in found:
                yield path, node


def _lines(node) -> int:
    return node.end_lineno - node.lineno + 1


def test_no_class_over_400_lines(nodes):
    long = [f"{p}:{n.lineno} {n.name} ({_lines(n)} lines)" for p, n in _nodes(nodes, PACKAGES)
            if isinstance(n, ast.ClassDef) and _lines(n) > MAX_CLASS_LINES]
    assert not long, long


def test_no_long_function_nor_long_parameter_list_in_the_cost_and_the_engine(nodes):
    bad = []
    for p, n in _nodes(nodes, STRICT):
        if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        a = n.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
        params = [x for x in params if x.arg not in ("self", "cls")]
        if _lines(n) > MAX_FUNCTION_LINES or len(params) > MAX_PARAMETERS:
            bad.append(f"{p}:{n.lineno} {n.name} ({_lines(n)} lines, {len(params)} parameters)")
    assert not bad, bad


def test_no_module_over_700_lines():
    long = [f"{path.relative_to(ROOT).as_posix()} ({n} lines)"
            for folder in PACKAGES for path in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, long
