"""The registry of execution models: the only code that turns operator work into seconds.

An execution model is a module that defines a class with `name`, `check_params(table, where)`
and `step_cost(graph, chip, comm_time, options)`, and calls `register` on import. Adding one is
one module plus its name in BUILTIN.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from chip.cost import StepCost
from chip.spec import ChipSpec
from workloads.errors import ConfigError
from workloads.ops import Collective, Graph, Work

CommTime = Callable[[Collective], Work]

BUILTIN = ("chip.roofline",)


class ExecutionModel(Protocol):
    name: str

    def check_params(self, table: Mapping[str, Any], where: str) -> None: ...

    def step_cost(
        self, graph: Graph, chip: ChipSpec, comm_time: CommTime, options: Any = None
    ) -> StepCost: ...


MODELS: dict[str, ExecutionModel] = {}


def register(model: ExecutionModel) -> ExecutionModel:
    MODELS[model.name] = model
    return model


def get(name: str) -> ExecutionModel:
    if not MODELS:
        for module in BUILTIN:
            importlib.import_module(module)
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(
            f"execution_model: unknown {name!r}; accepted: {', '.join(sorted(MODELS))}"
        ) from None


def check_params(model_name: str, table: Mapping[str, Any], where: str) -> None:
    get(model_name).check_params(table, where)


def step_cost(
    graph: Graph,
    chip: ChipSpec,
    comm_time: CommTime,
    options: Any = None,
    model: str | None = None,
) -> StepCost:
    """Cost one socket's step with the chip's execution model, or `model` when given."""
    return get(model or chip.execution_model).step_cost(graph, chip, comm_time, options)
