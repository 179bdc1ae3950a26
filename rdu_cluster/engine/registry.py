"""One registry of engine policies (schedulers, replica routing, prefix-cache eviction): a
policy is a module that registers a class with a `name`; the registry imports its built-in
modules on first use, so adding a policy is one module plus its name in the built-in list."""

from __future__ import annotations

import importlib

from workloads.errors import ConfigError


class Registry:
    def __init__(self, option: str, builtin: tuple[str, ...]) -> None:
        self.option = option  # the CLI option that names a policy, for the error message
        self.builtin = builtin
        self.classes: dict[str, type] = {}

    def register(self, cls: type) -> type:
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

    def _load(self) -> None:
        for module in self.builtin:
            importlib.import_module(module)
