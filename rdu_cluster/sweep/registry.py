"""The registry of sweep runners: scenario kind -> what fields it takes and how to run points.

A runner turns a list of points of its kind into result rows. It runs on a worker (in-process or
a Ray task), so it must depend only on the points and the seed. Adding a kind is one `Runner` and
one `register` call; the built-in kinds (simulate, plan, serve) are the modules of
rdu_cluster.sweep.runners, a kind a module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from rdu_cluster.sweep.fields import FieldDef, Namespace
from workloads.errors import ConfigError


@dataclass(frozen=True)
class Point:
    """One design point: its id (a hash of its canonical scenario) and its fields."""

    id: str
    fields: Mapping[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


@dataclass
class RunOutput:
    """What a runner returns for a list of points: one table of rows with a `point_id` column
    (several rows per point where the kind has several phases), and the points it found
    infeasible, with the reason."""

    table: pa.Table | None
    infeasible: dict[str, str] = field(default_factory=dict)


RunFn = Callable[[Sequence[Point], int], RunOutput]
# Checks the distinct configs the points use before anything runs; raises ConfigError.
CheckFn = Callable[[Sequence[Point], Mapping[str, str]], None]


@dataclass(frozen=True)
class Runner:
    kind: str
    fields: Mapping[str, FieldDef]
    namespaces: tuple[Namespace, ...]
    run: RunFn
    check: CheckFn
    # Fields that one call of the runner costs as arrays: points that share every other field
    # belong in the same task, and a task may hold thousands of them.
    vector_fields: tuple[str, ...] = ()
    points_per_task: int = 2048
    partition_by: tuple[str, str] = ("cluster", "model")
    required: tuple[str | tuple[str, ...], ...] = ()  # a tuple: one of its names
    doc: str = ""


RUNNERS: dict[str, Runner] = {}
BUILTIN = ("rdu_cluster.sweep.runners",)


def register(runner: Runner) -> Runner:
    RUNNERS[runner.kind] = runner
    return runner


def get(kind: str, where: str = "sweep.kind") -> Runner:
    _load_builtin()
    try:
        return RUNNERS[kind]
    except KeyError:
        raise ConfigError(
            f"{where}: unknown kind {kind!r}; accepted: {', '.join(sorted(RUNNERS))}"
        ) from None


def kinds() -> list[str]:
    _load_builtin()
    return sorted(RUNNERS)


def _load_builtin() -> None:
    for module in BUILTIN:  # cheap once imported; a kind registered first must not hide them
        importlib.import_module(module)
