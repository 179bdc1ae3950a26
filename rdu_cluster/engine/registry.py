"""One registry of engine policies (schedulers, replica routing, prefix-cache eviction): a
policy is a module of the registry's package that registers a class with a `name`. The
registry imports every module of its package on first use, so adding a policy is one module
(and its test): no list to extend, no other file to touch (docs/extending.md)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Protocol, TypeVar

from workloads.errors import ConfigError


class Named(Protocol):
    name: str  # what the policy is registered as (the option's value)


_Policy = TypeVar("_Policy", bound="type[Named]")


class Registry:
    def __init__(self, option: str, package: str) -> None:
        self.option = option  # the CLI option that names a policy, for the error message
        self.package = package  # its modules are the policies, imported on first use
        self.classes: dict[str, type] = {}
        self._loaded = False

    def register(self, cls: _Policy) -> _Policy:
        self.classes[cls.name] = cls
        return cls

    def names(self) -> list[str]:
        self._load()
        return sorted(self.classes)

    def cls(self, name: str) -> type:
        """The class registered as `name`; unknown names are one line listing the accepted."""
        self._load()
        try:
            return self.classes[name]
        except KeyError:
            raise ConfigError(
                f"{self.option}: unknown {name!r}; accepted: {', '.join(sorted(self.classes))}"
            ) from None

    def modules(self) -> list[str]:
        """The policy modules of the package, sorted (the import order, so a run is the same
        wherever it runs)."""
        path = importlib.import_module(self.package).__path__
        return sorted(f"{self.package}.{m.name}" for m in pkgutil.iter_modules(path)
                      if not m.name.startswith("_"))

    def _load(self) -> None:
        if self._loaded:
            return
        for module in self.modules():
            importlib.import_module(module)
        self._loaded = True
