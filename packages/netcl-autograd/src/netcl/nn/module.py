"""``Module``: the base class of layers and models, as PyTorch's ``torch.nn.Module``.

Attributes that are ``Parameter``s or ``Module``s register themselves on assignment; buffers
(non-trainable state such as BatchNorm's running statistics) are registered with
``register_buffer``. ``state_dict`` names everything with dotted paths (``"0.weight"``,
``"features.1.running_mean"``), the same keys PyTorch gives the same model, so weights carry over.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from netcl.autograd import mode_reads
from netcl.autograd.engine import HookHandle, Node, names_dtype
from netcl.core import Device, ShapeError, Tensor, get_device
from netcl.core.dtypes import is_floating
from netcl.nn.parameter import Parameter
from netcl.runtime.ops import layout
from netcl.runtime.ops.upload import write_


def _twice(what: str) -> Any:
    raise TypeError(f"Module.to: the {what} was given twice")


def _converted(t: Tensor, device: Device | None, dtype: np.dtype | None) -> Tensor:
    """``t`` on ``device`` (None: where it is) and, if floating-point, of ``dtype`` (None: its own); ``t`` itself
    when nothing changes."""
    moved = t if device is None or t.device is device else t.to(device)
    if dtype is not None and is_floating(t.dtype) and moved.dtype != dtype:
        moved = layout.cast(moved, dtype)
    return moved


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(strict=False)`` did not match."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of every layer: subclass it, set parameters and sub-modules in ``__init__``, write ``forward``."""

    def __init__(self) -> None:
        object.__setattr__(self, "_training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())

    # ---- registration ---------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {name!r} before Module.__init__() was called")
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Parameter):
            self._forget(name, keep=params)
            params[name] = value
        elif isinstance(value, Module):
            self._forget(name, keep=modules)
            modules[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign {type(value).__name__} as parameter {name!r} (Parameter or None expected)"
                )
            params[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign {type(value).__name__} as buffer {name!r} (Tensor or None expected)")
            buffers[name] = value
        elif name in modules:
            if value is not None:
                raise TypeError(
                    f"cannot assign {type(value).__name__} as child module {name!r} (Module or None expected)"
                )
            modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name: str, keep: dict | None = None) -> None:
        """Remove ``name`` from every table but ``keep`` (where it is overwritten in place, keeping its order)."""
        self.__dict__.pop(name, None)
        for table in (self._parameters, self._buffers, self._modules):
            if table is not keep:
                table.pop(name, None)
        self._non_persistent.discard(name)

    def __getattr__(self, name: str) -> Any:
        for table in ("_parameters", "_buffers", "_modules"):
            entries = self.__dict__.get(table)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add ``param`` (or None: a declared but absent parameter, like ``bias=False``) under ``name``."""
        self._check_name(name)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: {name!r} must be a Parameter or None, got {type(param).__name__}")
        self._forget(name, keep=self._parameters)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add non-trainable state (a ``Tensor``); ``persistent=False`` leaves it out of ``state_dict``."""
        self._check_name(name)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: {name!r} must be a Tensor or None, got {type(tensor).__name__}")
        self._forget(name, keep=self._buffers)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        """Add a child module under ``name``."""
        self._check_name(name)
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module: {name!r} must be a Module or None, got {type(module).__name__}")
        self._forget(name, keep=self._modules)
        self._modules[name] = module

    register_module = add_module

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"module attribute name must be a non-empty str without '.', got {name!r}")
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot register before Module.__init__() was called")

    # ---- traversal ------------------------------------------------------------------------------
    def named_modules(self, prefix: str = "", memo: set[int] | None = None) -> Iterator[tuple[str, Module]]:
        """This module and every descendant, each once, with its dotted name ("" for this one)."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, child in self._modules.items():
            if child is not None:
                yield name, child

    def children(self) -> Iterator[Module]:
        for _, child in self.named_children():
            yield child

    def _named_members(self, table: str, prefix: str, recurse: bool) -> Iterator[tuple[str, Any]]:
        seen: set[int] = set()
        modules = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for module_prefix, module in modules:
            for name, value in getattr(module, table).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                yield (f"{module_prefix}.{name}" if module_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, Parameter) pairs; a parameter shared by two modules appears once."""
        return self._named_members("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, buffer in self.named_buffers(recurse=recurse):
            yield buffer

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn`` on every sub-module (children first) and on this module; returns self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # ---- modes, devices, gradients -------------------------------------------------------------
    @property
    def training(self) -> bool:
        """Whether this module is in training mode. A read inside a traced or captured step is recorded
        (``netcl.autograd.mode_reads``): the compiled plan or replay then notices a later ``train``/``eval``."""
        mode = self._training
        mode_reads.note(self, mode)
        return mode

    @training.setter
    def training(self, mode: bool) -> None:
        if not isinstance(mode, bool):
            raise TypeError(f"training must be a bool, got {type(mode).__name__}")
        object.__setattr__(self, "_training", mode)

    def train(self, mode: bool = True) -> Module:
        """Training mode (dropout active, BatchNorm uses and updates batch statistics); returns self."""
        if not isinstance(mode, bool):
            raise TypeError(f"train: mode must be a bool, got {type(mode).__name__}")
        for module in self.modules():
            object.__setattr__(module, "_training", mode)
        return self

    def eval(self) -> Module:
        """Evaluation mode (``train(False)``); returns self."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for param in self.parameters():
            param.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient (None, or zeros with ``set_to_none=False``)."""
        from netcl.optim.optimizer import clear_grad

        for param in self.parameters():
            clear_grad(param, set_to_none)

    def to(self, *args: Any, device: Device | str | None = None, dtype: Any = None) -> Module:
        """torch's ``to``: ``to(device)``, ``to(dtype)``, ``to(device, dtype)`` or by keyword. Moves every parameter
        and buffer to ``device`` and casts the floating-point ones to ``dtype`` (integer buffers keep theirs), in
        place: the Parameter objects stay and get new tensors (their gradients are cleared); returns self."""
        for arg in args:
            if not names_dtype(arg):
                device = arg if device is None else _twice("device")
            else:
                dtype = arg if dtype is None else _twice("dtype")
        if device is None and dtype is None:
            raise TypeError("Module.to needs a device, a dtype or both")
        target = None if device is None else get_device(device)
        kind = None if dtype is None else np.dtype(dtype)
        if kind is not None and not is_floating(kind):
            raise TypeError(f"Module.to: dtype must be a floating-point type, got {kind}")
        for module in self.modules():
            for param in module._parameters.values():
                if param is not None:
                    moved = _converted(param.value, target, kind)
                    if moved is not param.value:
                        param.value = moved
                        param.grad, param._grad_owned = None, False
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[name] = _converted(buffer, target, kind)
        return self

    def cuda(self, device: int | None = None) -> Module:
        """torch's ``cuda()``: ``to("cuda")`` (OpenCL GPU ``device``, default 0)."""
        return self.to("cuda" if device is None else f"cuda:{device}")

    def cpu(self) -> Module:
        """torch's ``cpu()``: ``to("cpu")``, the NumPy backend (the host's device)."""
        return self.to("cpu")

    def half(self) -> Module:
        """Floating-point parameters and buffers to float16 (``to(float16)``)."""
        return self.to(dtype=np.float16)

    def float(self) -> Module:
        """Floating-point parameters and buffers to float32."""
        return self.to(dtype=np.float32)

    def double(self) -> Module:
        """Floating-point parameters and buffers to float64."""
        return self.to(dtype=np.float64)

    def get_submodule(self, target: str) -> Module:
        """The sub-module at the dotted path ``target`` ("" is this module), as torch's."""
        module: Module = self
        for part in target.split(".") if target else []:
            child = module._modules.get(part)
            if child is None:
                raise AttributeError(f"{type(module).__name__} has no submodule {part!r} (looking up {target!r})")
            module = child
        return module

    def get_parameter(self, target: str) -> Parameter:
        """The parameter at the dotted path ``target`` (``"0.weight"``)."""
        owner, _, name = target.rpartition(".")
        param = self.get_submodule(owner)._parameters.get(name)
        if param is None:
            raise AttributeError(f"{target!r} is not a parameter of this module")
        return param

    @property
    def device(self) -> Device | None:
        """The device of the first parameter or buffer (None for a module without state)."""
        for _, value in self._named_members("_parameters", "", True):
            return value.device
        for _, value in self._named_members("_buffers", "", True):
            return value.device
        return None

    # ---- state ----------------------------------------------------------------------------------
    def state_dict(self, prefix: str = "") -> OrderedDict[str, Tensor]:
        """Every parameter's and persistent buffer's ``Tensor`` by dotted name (PyTorch's keys).

        The Tensors are the live ones (not copies); ``{k: v.numpy() for k, v in ...}`` gives host arrays.
        """
        result: OrderedDict[str, Tensor] = OrderedDict()
        for module_prefix, module in self.named_modules(prefix):
            dotted = f"{module_prefix}." if module_prefix else ""
            for name, param in module._parameters.items():
                if param is not None:
                    result[dotted + name] = param.value
            for name, buffer in module._buffers.items():
                if buffer is not None and name not in module._non_persistent:
                    result[dotted + name] = buffer
        return result

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy values (``Tensor``s, ``Node``s, NumPy arrays, anything ``np.asarray`` takes, e.g. torch
        tensors on the CPU) into this module's parameters and buffers, in place.

        With ``strict`` every key must match: missing or unexpected keys raise ``KeyError`` naming
        them. A shape mismatch always raises ``ShapeError`` naming the key and both shapes. Nothing
        is written unless every check passes.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict: expected a mapping of name -> array, got {type(state_dict).__name__}")
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            parts = []
            if missing:
                parts.append(f"missing keys {missing}")
            if unexpected:
                parts.append(f"unexpected keys {unexpected}")
            raise KeyError(f"load_state_dict for {type(self).__name__}: " + "; ".join(parts))
        staged: list[tuple[Tensor, np.ndarray]] = []
        for key, target in own.items():
            if key not in state_dict:
                continue
            host = _host_array(state_dict[key], key)
            if tuple(host.shape) != tuple(target.shape):
                raise ShapeError(
                    f"load_state_dict: {key!r} has shape {tuple(host.shape)} in the state dict, "
                    f"but the model's is {tuple(target.shape)}"
                )
            if host.dtype.kind not in "fiub" and not is_floating(host.dtype):
                raise TypeError(f"load_state_dict: {key!r} has dtype {host.dtype}, expected a numeric array")
            staged.append((target, host))
        for target, host in staged:
            write_(target, host)
        return IncompatibleKeys(missing, unexpected)

    # ---- calling and printing --------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no forward(); subclasses of Module define it")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pre, post = self._forward_pre_hooks, self._forward_hooks
        if not pre and not post:
            return self.forward(*args, **kwargs)
        for hook in list(pre):
            changed = hook(self, args)
            if changed is not None:
                args = changed if isinstance(changed, tuple) else (changed,)
        output = self.forward(*args, **kwargs)
        for hook in list(post):
            changed = hook(self, args, output)
            if changed is not None:
                output = changed
        return output

    #: hooks in registration order; the class's are empty tuples (``_add_hook`` gives a module its own lists)
    _forward_pre_hooks: Sequence[Callable[..., Any]] = ()
    _forward_hooks: Sequence[Callable[..., Any]] = ()

    def register_forward_pre_hook(self, hook: Callable[[Module, tuple], Any]) -> HookHandle:
        """Run ``hook(module, args)`` before each ``forward`` (torch's); a returned value replaces the positional
        arguments (a tuple, or one value). Inside ``jit_compile`` / ``fuse_graph`` a hook runs while the step is
        traced or captured, not on the cached or replayed calls (docs/replay.md)."""
        return self._add_hook("_forward_pre_hooks", hook)

    def register_forward_hook(self, hook: Callable[[Module, tuple, Any], Any]) -> HookHandle:
        """Run ``hook(module, args, output)`` after each ``forward`` (torch's); a returned value replaces the output."""
        return self._add_hook("_forward_hooks", hook)

    def _add_hook(self, table: str, hook: Callable[..., Any]) -> HookHandle:
        if not callable(hook):
            raise TypeError(f"{table.strip('_')}: hook must be callable, got {type(hook).__name__}")
        hooks = self.__dict__.get(table)
        if hooks is None:
            hooks = []
            object.__setattr__(self, table, hooks)
        hooks.append(hook)
        return HookHandle(hooks, hook)

    def extra_repr(self) -> str:
        """The text inside this module's parentheses in ``repr`` (override in layers)."""
        return ""

    def __repr__(self) -> str:
        lines = [line for line in self.extra_repr().split("\n") if line]
        for name, child in self._modules.items():
            text = repr(child).replace("\n", "\n  ")
            lines.append(f"({name}): {text}")
        if not self._modules:
            return f"{type(self).__name__}({', '.join(lines)})" if len(lines) <= 1 else self._multiline(lines)
        return self._multiline(lines)

    def _multiline(self, lines: list[str]) -> str:
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))


def _host_array(value: Any, key: str) -> np.ndarray:
    if isinstance(value, Node):
        value = value.value
    if isinstance(value, Tensor):
        return value.to_host()
    detach = getattr(value, "detach", None)
    if callable(detach) and hasattr(value, "cpu"):  # a torch tensor: host NumPy without importing torch
        value = detach().cpu().numpy()
    try:
        return np.asarray(value)
    except Exception as exc:
        raise TypeError(f"load_state_dict: cannot read {key!r} ({type(value).__name__}) as an array: {exc}") from exc
