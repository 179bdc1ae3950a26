"""The registry of execution models: the only code that turns operator work into seconds.

An execution model is a module that defines a class with `name`, `check_params(table, where)`
and `step_cost(graph, chip, comm_time, options)` (optionally `check_chip(chip, where)`: its
parameters against the rest of the chip), and calls `register` on import. Adding one is one
module plus its name in BUILTIN.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from chip import kernel_efficiency
from chip.cost import StepCost
from chip.spec import ChipSpec
from workloads import checks
from workloads.errors import ConfigError
from workloads.ops import Collective, Graph, Work

CommTime = Callable[[Collective], Work]
if TYPE_CHECKING:
    from _typeshed import DataclassInstance

P = TypeVar("P", bound="DataclassInstance")

BUILTIN = ("chip.roofline", "chip.dataflow", "chip.kernel_by_kernel")


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


def _load_builtin() -> None:
    for module in BUILTIN:
        importlib.import_module(module)


def get(name: str) -> ExecutionModel:
    if name not in MODELS:
        _load_builtin()
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(
            f"execution_model: unknown {name!r}; accepted: {', '.join(sorted(MODELS))}"
        ) from None


def options_of(options: Any, cls: type[P], model_name: str) -> P:
    """The options an execution model was given, or its defaults; another model's options are
    a ConfigError rather than silently ignored."""
    if options is None:
        return cls()
    if not isinstance(options, cls):
        raise ConfigError(
            f"options: the {model_name} model takes {cls.__name__}, got {type(options).__name__}"
        )
    return options


def check_params(model_name: str, table: Mapping[str, Any], where: str) -> None:
    get(model_name).check_params(table, where)


def check_runs_on(name: str, chip: ChipSpec) -> None:
    """A chip's [execution] table holds the parameters of its own execution model, so another
    model can run on it only if it reads none (`reads_params = False`: roofline)."""
    if name == chip.execution_model or not getattr(get(name), "reads_params", True):
        return
    _load_builtin()
    anywhere = sorted(n for n, m in MODELS.items() if not getattr(m, "reads_params", True))
    raise ConfigError(
        f"execution_model: {name!r} reads parameters chip {chip.name} does not give (its "
        f"[execution] table is for {chip.execution_model!r}); accepted on it: "
        f"{', '.join([chip.execution_model, *anywhere])}"
    )


def check_chip(chip: ChipSpec, where: str) -> None:
    """The chip's [execution] values against the rest of it (a buffer against the memory that
    holds it), for the models that have such a check: run on the values a run uses, after a
    calibration profile has set them."""
    check = getattr(get(chip.execution_model), "check_chip", None)
    if check is not None:
        check(chip, where)


def step_cost(
    graph: Graph,
    chip: ChipSpec,
    comm_time: CommTime,
    options: Any = None,
    model: str | None = None,
) -> StepCost:
    """Cost one socket's step with the chip's execution model, or `model` when given."""
    return get(model or chip.execution_model).step_cost(graph, chip, comm_time, options)


def parse_params(cls: type[P], table: Mapping[str, Any], where: str) -> P:
    """Build a frozen params dataclass from an [execution] table with exactly its fields.

    Every field is a non-negative number (seconds, bytes, counts); fields whose name ends in
    `_efficiency` or `_fraction` must lie in (0, 1], seconds (`_s`) at most
    checks.MAX_LATENCY_S. Errors name `<where>.<key>`."""
    names = [f.name for f in dataclasses.fields(cls)]
    # a serving stack's kernel figures, which a calibration profile adds beside the chip's own
    # (chip/kernel_efficiency.py): checked here, read by the execution model per stack
    stack_keys = [k for k in table if kernel_efficiency.is_stack_key(k)]
    for k in stack_keys:
        why = kernel_efficiency.check_value(k, table[k])
        if why is not None:
            raise ConfigError(f"{where}.{k}: {why}, got {table[k]!r}")
    if stack_keys:
        table = {k: v for k, v in table.items() if k not in stack_keys}
    checks.exact_keys(table, names, where)
    values = {}
    for name in names:
        seconds = name.endswith("_s") and not name.endswith("_per_s")
        v = checks.latency(table, name, where) if seconds else checks.non_negative(table, name,
                                                                                   where)
        if name.endswith(("_efficiency", "_fraction")) and not 0 < v <= 1:
            raise ConfigError(f"{where}.{name}: expected a fraction in (0, 1], got {v!r}")
        values[name] = v
    return cls(**values)


_PARAMS: dict[tuple, tuple] = {}
_BY_TABLE: dict[tuple, Any] = {}


def params_for(cls: type[P], chip: ChipSpec) -> P:
    """The chip's parameters for one model, parsed once per chip (every step of a plan search
    asks): keyed by the chip's identity, kept only while its table is the same; a new chip with
    the same table of the model's own keys (a fit varies only a stack's kernel figures,
    chip/kernel_efficiency.py) reuses the parse."""
    key = (cls, id(chip))
    hit = _PARAMS.get(key)
    if hit is None or hit[0] is not chip or hit[1] != chip.execution:
        own = tuple(sorted((k, v) for k, v in chip.execution.items()
                           if not kernel_efficiency.is_stack_key(k)))
        content = (cls, chip.name, own)
        params = _BY_TABLE.get(content)
        if params is None:  # (values are numbers: chip loading checked them)
            params = parse_params(cls, chip.execution, f"chips/{chip.name}.toml: execution")
            if len(_BY_TABLE) > 256:
                _BY_TABLE.clear()
            _BY_TABLE[content] = params
        if len(_PARAMS) > 256:
            _PARAMS.clear()
        hit = _PARAMS[key] = (chip, dict(chip.execution), params)
    return hit[2]
