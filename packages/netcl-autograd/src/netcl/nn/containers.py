"""Containers: ``Sequential`` (runs its modules in order), ``ModuleList`` and ``ModuleDict`` (hold modules)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from netcl.nn.module import Module


def _index(i: Any, length: int, who: str) -> int:
    if isinstance(i, bool) or not isinstance(i, int):
        raise TypeError(f"{who} indices must be ints or slices, got {type(i).__name__}")
    if not -length <= i < length:
        raise IndexError(f"{who} index {i} is out of range for {length} modules")
    return i % length


class Sequential(Module):
    """``Sequential(m0, m1, ...)`` or ``Sequential(OrderedDict(name=module))``: ``forward`` chains them."""

    def __init__(self, *modules: Module | OrderedDict) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(modules):
                self.add_module(str(i), module)

    def forward(self, x: Any) -> Any:
        for module in self._modules.values():
            x = module(x)
        return x

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, i: int | slice) -> Any:
        items = list(self._modules.items())
        if isinstance(i, slice):
            return Sequential(OrderedDict(items[i]))
        return items[_index(i, len(items), "Sequential")][1]


class ModuleList(Module):
    """A list of modules whose parameters the owner sees (``"0.weight"``, ``"1.weight"``, ...)."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self.add_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, i: int | slice) -> Any:
        items = list(self._modules.values())
        if isinstance(i, slice):
            return ModuleList(items[i])
        return items[_index(i, len(items), "ModuleList")]

    def __setitem__(self, i: int, module: Module) -> None:
        self.add_module(str(_index(i, len(self), "ModuleList")), module)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ModuleList has no forward(); iterate over it in the owner's forward")


class ModuleDict(Module):
    """A dict of modules whose parameters the owner sees under their keys (``"encoder.weight"``), in insertion
    order, as torch's."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        for name, module in modules.items() if isinstance(modules, Mapping) else modules:
            self[name] = module

    def __getitem__(self, key: str) -> Module:
        if key not in self._modules:
            raise KeyError(f"ModuleDict has no module {key!r}")
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        self[key]
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def values(self) -> Iterable[Module]:
        return self._modules.values()

    def items(self) -> Iterable[tuple[str, Module]]:
        return self._modules.items()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ModuleDict has no forward(); call its modules in the owner's forward")
