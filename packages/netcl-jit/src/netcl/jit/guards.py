"""Guards on captured tensors: a compiled plan notices when a tensor it closed over is rebound.

A jitted function may read tensors that are not its arguments (``lambda x: x + c``): the trace
turns each into a *const* input of the plan, bound to that very object. If the user then binds
``c`` (or the global, attribute or dict entry the function reads) to another tensor, the plan
must not keep adding the old one. At trace time ``find_guards`` looks for the path by which the
function reaches each captured object: a closure cell, a module global, an attribute of ``self``
or of an argument, a dict entry or list item reached from those, or the same inside a function
or callable object reached from those (a model's ``__call__`` reading ``self.w``). It compiles the
paths into one small function that re-reads them on every call and compares identities: a cache
hit costs a few attribute loads and ``is`` comparisons. A capture with no path found (made by a
function call, read through a property...) cannot be watched; ``jit_compile`` warns about it once.
A ``netcl.nn.Module``'s parameters and buffers are one step from the module (by their state_dict
names), so a model's weights are watched however deeply its layers nest.

Python numbers are baked into the generated kernels as literals (``x * scale``), so the same search
watches them (``find_number_guards``): every float, and every int within ``INT_DEPTH`` steps of the
function, reached by such a path whose value the trace used as an op's constant (an elementwise op's
scalar operand, an attribute such as a clamp bound, a slope, an axis or a reshape's dimension) is
compared by value on each call. A number the function
transforms before using it, or reads to choose a branch, is not matched: pass it as an argument (a
kernel argument, never baked).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.nn.module import Module

#: How many steps a path may take from its root (cell -> object -> dict -> tensor is 3).
MAX_DEPTH = 4
#: How many steps from the function an int may be to be watched (a global, a closure variable, ``self.rows``,
#: a dict entry of those): farther ints are mostly other objects' counters (a Trainer's step count, reached
#: through its loss method), which pass through every small int a trace holds and would re-trace each step.
INT_DEPTH = 2
#: Containers larger than this are not searched (a module's namespace, a big dataset dict).
MAX_ITEMS = 256
#: The search stops after visiting this many objects (a trace of a large model stays fast).
MAX_OBJECTS = 20000

_MISSING = object()

#: A step of a path: ("attr", name) | ("item", key) | ("cell",) | ("closure", i) | ("globals", name)
#: | ("named", (("_modules", "features"), ("_modules", "0"), ("_parameters", "weight"))) (a netcl.nn Module's
#: parameter or buffer, one step from the model, read through the tables that hold each part of its name).
Step = tuple[Any, ...]


def find_guards(fn: Callable[..., Any], args: tuple[Any, ...], captured: list[Any]):
    """(check, unwatched): ``check(args) -> bool`` is True while every watched capture is the same
    object (None when nothing is watched); ``unwatched`` lists the captures with no path."""
    wanted = {id(value): value for value in captured}
    paths: dict[int, tuple[str, Any, list[Step]]] = {}
    for root_kind, root, steps, obj in _walk(fn, args):
        key = id(obj)
        if key in wanted and key not in paths:
            paths[key] = (root_kind, root, steps)
            if len(paths) == len(wanted):
                break
    unwatched = [value for key, value in wanted.items() if key not in paths]
    if not paths:
        return None, unwatched
    return _compile_check([(paths[key], wanted[key]) for key in paths]), unwatched


def find_number_guards(
    fn: Callable[..., Any], args: tuple[Any, ...], used: set[tuple[type, Any]]
) -> Callable[[tuple[Any, ...]], bool] | None:
    """``check(args) -> bool``, True while every Python number reached from ``fn`` (not an argument
    itself) whose (type, value) is in ``used`` still has that value; None when no such number is found."""
    if not used:
        return None
    guards = [
        ((root_kind, root, steps), obj)
        for root_kind, root, steps, obj in _walk(fn, args)
        if (type(obj) is float or (type(obj) is int and len(steps) <= INT_DEPTH))
        and (type(obj), obj) in used
        and (steps or root_kind != "arg")
    ]
    return _compile_check(guards, by_value=True) if guards else None


def traced_numbers(attrs: dict[str, Any]) -> Iterator[tuple[type, Any]]:
    """The Python numbers an op's ``attrs`` bake into its plan, as (type, value): its scalar operand, its
    number attributes (a clamp bound, a slope, an axis) and the numbers of its tuple attributes (a reshape's
    shape). Bools are flags, not numbers: never matched."""
    for value in attrs.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if type(item) in (int, float):
                yield type(item), item


# ---- searching ----------------------------------------------------------------------------------
def _walk(fn: Callable[..., Any], args: tuple[Any, ...]) -> Iterator[tuple[str, Any, list[Step], Any]]:
    """Breadth-first: (root kind, root, steps, object reached) for every object reachable."""
    seen: set[int] = set()
    frontier: list[tuple[str, Any, list[Step], Any]] = []
    for position, arg in enumerate(args):
        if not isinstance(arg, (Node, Tensor)):
            frontier.append(("arg", position, [], arg))
    frontier.extend(_function_roots(fn))
    for _ in range(MAX_DEPTH + 1):
        following: list[tuple[str, Any, list[Step], Any]] = []
        for root_kind, root, steps, obj in frontier:
            if type(obj) in (int, float):  # a number: every path to it (equal small ints are one object)
                yield root_kind, root, steps, obj
                continue
            if id(obj) in seen:
                continue
            if len(seen) >= MAX_OBJECTS:
                return
            seen.add(id(obj))
            yield root_kind, root, steps, obj
            if len(steps) < MAX_DEPTH:
                following.extend((root_kind, root, [*steps, step], child) for step, child in _children(obj))
        frontier = following


def _function_roots(fn: Any) -> list[tuple[str, Any, list[Step], Any]]:
    """The roots a callable reads from: its closure cells, the globals it names, its ``self``."""
    roots: list[tuple[str, Any, list[Step], Any]] = []
    if isinstance(fn, types.MethodType):
        roots.append(("object", fn, [("attr", "__self__")], fn.__self__))
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        if fn is not None and not isinstance(fn, type):
            roots.append(("object", fn, [], fn))  # a callable object: its attributes are its state
        return roots
    for cell in fn.__closure__ or ():
        try:
            roots.append(("object", cell, [("cell",)], cell.cell_contents))
        except ValueError:  # an empty cell
            continue
    namespace = fn.__globals__
    for name in _names(fn.__code__):
        if name in namespace:
            roots.append(("object", namespace, [("item", name)], namespace[name]))
    return roots


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _children(obj: Any) -> Iterator[tuple[Step, Any]]:
    """One step down from ``obj``: what a function could read through it."""
    if isinstance(obj, (Tensor, str, bytes, int, float, complex, bool, type(None))):
        return
    if isinstance(obj, Node):
        yield ("attr", "value"), obj.value
        return
    if isinstance(obj, types.FunctionType):
        for i, cell in enumerate(obj.__closure__ or ()):
            try:
                yield ("closure", i), cell.cell_contents
            except ValueError:
                continue
        namespace = obj.__globals__
        for name in _names(obj.__code__):
            if name in namespace and not isinstance(namespace[name], types.ModuleType):
                yield ("globals", name), namespace[name]
        return
    if isinstance(obj, types.MethodType):
        yield ("attr", "__self__"), obj.__self__
        yield ("attr", "__func__"), obj.__func__
        return
    if isinstance(obj, dict):
        if len(obj) <= MAX_ITEMS:
            for key, value in list(obj.items()):
                if _hashable_key(key):
                    yield ("item", key), value
        return
    if isinstance(obj, (list, tuple)):
        if len(obj) <= MAX_ITEMS:
            for i, value in enumerate(obj):
                yield ("item", i), value
        return
    if isinstance(obj, functools.partial):
        yield ("attr", "func"), obj.func
        yield ("attr", "args"), obj.args
        yield ("attr", "keywords"), obj.keywords
        return
    if isinstance(obj, (types.ModuleType, type, types.BuiltinFunctionType)):
        return  # a module's or class's namespace is not the caller's state
    if isinstance(obj, Module):  # a model: each parameter and buffer one step away, by its dotted name
        for name, value in (*obj.named_parameters(), *obj.named_buffers()):
            yield ("named", _module_hops(obj, name)), value
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict) and len(state) <= MAX_ITEMS:
        for name, value in list(state.items()):
            yield ("attr", name), value
    for cls in type(obj).__mro__:
        for name in cls.__dict__.get("__slots__", ()):
            if isinstance(name, str) and not name.startswith("__") and hasattr(obj, name):
                yield ("attr", name), getattr(obj, name)


def _module_hops(module: Any, dotted: str) -> tuple[tuple[str | None, str], ...]:
    """For a Module and a state_dict name ("layer1.0.conv1.weight"): the table holding each part of it,
    ("_modules", "layer1") ... ("_parameters", "weight"), so a guard reads plain dicts instead of going
    through ``Module.__getattr__`` once per part (a few times faster); a part in no table is (None, part),
    read as an attribute."""
    hops = []
    for part in dotted.split("."):
        state = getattr(module, "__dict__", None) or {}
        table = next((t for t in ("_modules", "_parameters", "_buffers") if part in (state.get(t) or ())), None)
        hops.append((table, part))
        module = state[table][part] if table else getattr(module, part, None)
    return tuple(hops)


def _hashable_key(key: Any) -> bool:
    """Keys a guard can hold as they are: strings, numbers and tuples of them."""
    if isinstance(key, tuple):
        return all(isinstance(k, (str, int, float, bool)) for k in key)
    return isinstance(key, (str, int, float, bool))


# ---- checking ------------------------------------------------------------------------------------
def _compile_check(
    guards: list[tuple[tuple[str, Any, list[Step]], Any]], by_value: bool = False
) -> Callable[[tuple[Any, ...]], bool]:
    """One function testing every guard: ``path(args) is expected`` for each (``by_value``: of the
    expected type and equal to it), False on any error."""
    env: dict[str, Any] = {"_M": _MISSING}
    terms = []
    for n, ((root_kind, root, steps), expected) in enumerate(guards):
        if root_kind == "arg":
            expr = f"args[{root}]"
        else:
            env[f"r{n}"] = root
            expr = f"r{n}"
        for k, step in enumerate(steps):
            expr = _step_expr(expr, step, env, f"k{n}_{k}")
        env[f"e{n}"] = expected
        if by_value:
            env[f"t{n}"] = type(expected)
            terms.append(f"(type(v{n} := {expr}) is t{n} and v{n} == e{n})")
        else:
            terms.append(f"({expr}) is e{n}")
    source = "def check(args):\n    try:\n        return " + " and ".join(terms) + "\n    except Exception:\n"
    source += "        return False\n"
    exec(compile(source, "<netcl.jit guard>", "exec"), env)  # generated from our own paths, nothing user-typed
    check = env["check"]
    check.paths = len(guards)
    return check


def _step_expr(expr: str, step: Step, env: dict[str, Any], name: str) -> str:
    kind = step[0]
    if kind == "cell":
        return f"{expr}.cell_contents"
    if kind == "closure":
        return f"{expr}.__closure__[{step[1]}].cell_contents"
    if kind == "globals":
        env[name] = step[1]
        return f"{expr}.__globals__.get({name}, _M)"
    if kind == "attr":
        env[name] = step[1]
        return f"getattr({expr}, {name}, _M)"
    if kind == "named":  # through the module tables' dicts; a part in none of them as an attribute
        for table, part in step[1]:
            expr = f"{expr}.{table}[{part!r}]" if table else f"getattr({expr}, {part!r}, _M)"
        return expr
    env[name] = step[1]  # item
    return f"{expr}[{name}]"
