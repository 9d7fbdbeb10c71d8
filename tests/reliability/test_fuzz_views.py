"""Differential fuzzing of views: random chains of transposes and basic indexing against NumPy's views.

Each example draws a float32 array of 1-4 axes (sizes 0-5) and a chain of 1-4 view steps (``.T``,
``permute``, ``transpose(d0, d1)``, ``x[key]`` with ints, slices of any step and sign, ``None`` and ``...``),
each valid for the shape the chain has reached. NumPy's transposes and basic indexing are views too, so the
reference is exact and the checks are bit for bit:

* the values, read directly (``to_host``, a gather) and through ops whose kernels read the view in place
  (``view * 2``, ``view - w``, ``view * view``);
* the gradient of ``sum(view * w)``: ``w`` written through NumPy's same view chain into zeros of the input's
  shape (basic views never select an element twice, so each source element gets at most one ``w``);
* that the view reads its source's current values: after an in-place add into the source, a new read of the
  same view object shows the added values;
* that making the chain launched nothing (``netcl.profiler``: no kernel, no copy).

The ``ci`` profile runs the same examples every run (``derandomize``): the NumPy backend all of
``max_examples``, OpenCL a quarter (views build only the shape-generic strided-copy and transpose kernels).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import netcl.autograd as ag
import netcl.core as nc
from netcl.profiler import profile
from netcl.runtime import ops

Step = tuple[Any, ...]


@st.composite
def _key(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """A basic index valid for ``shape``: per axis an int, a slice or nothing, with ``None``s and one ``...``."""
    items: list[Any] = []
    axes = draw(st.integers(0, len(shape)))  # how many leading axes the key names
    for size in shape[:axes]:
        kind = draw(st.sampled_from(["int", "slice", "slice", "none"] if size else ["slice", "none"]))
        if kind == "int":
            items.append(draw(st.integers(-size, size - 1)))
        elif kind == "slice":
            bound = st.one_of(st.none(), st.integers(-size - 2, size + 2))
            items.append(slice(draw(bound), draw(bound), draw(st.sampled_from([None, 1, 2, 3, -1, -2]))))
        else:
            items.append(None)
            items.append(slice(None))  # the axis itself stays
    if draw(st.booleans()):  # anywhere when the key names every axis (it stands for none), else last
        items.insert(draw(st.integers(0, len(items))) if axes == len(shape) else len(items), Ellipsis)
    return tuple(items)


@st.composite
def _steps(draw: st.DrawFn, shape: tuple[int, ...]) -> list[Step]:
    steps: list[Step] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["T", "permute", "swap", "key", "key"]))
        if kind == "T":
            steps.append(("T",))
            shape = shape[::-1]
        elif kind == "permute":
            perm = tuple(draw(st.permutations(range(len(shape)))))
            steps.append(("permute", perm))
            shape = tuple(shape[a] for a in perm)
        elif kind == "swap" and shape:
            d0, d1 = draw(st.integers(0, len(shape) - 1)), draw(st.integers(0, len(shape) - 1))
            steps.append(("swap", d0, d1))
            order = list(range(len(shape)))
            order[d0], order[d1] = order[d1], order[d0]
            shape = tuple(shape[a] for a in order)
        else:
            key = draw(_key(shape))
            steps.append(("key", key))
            shape = np.empty(shape)[key].shape
    return steps


@st.composite
def cases(draw: st.DrawFn) -> tuple[np.ndarray, list[Step], np.ndarray]:
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=4)))
    seed = draw(st.integers(0, 2**31 - 1))
    steps = draw(_steps(shape))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(_apply(x, steps).shape).astype(np.float32)
    return x, steps, w


def _apply(x: Any, steps: list[Step]) -> Any:
    """The chain on a NumPy array or a Node (the same spelling: NumPy's views are the reference)."""
    for step in steps:
        if step[0] == "T":
            x = x.T
        elif step[0] == "permute":
            x = x.transpose(step[1]) if isinstance(x, np.ndarray) else x.permute(*step[1])
        elif step[0] == "swap":
            x = np.swapaxes(x, step[1], step[2]) if isinstance(x, np.ndarray) else x.transpose(step[1], step[2])
        elif isinstance(x, np.ndarray) and Ellipsis not in step[1]:
            x = x[(*step[1], Ellipsis)]  # the same selection; an all-int key gives a 0-d view, not a scalar
        else:
            x = x[step[1]]
    return x


def run_case(x: np.ndarray, steps: list[Step], w: np.ndarray, device: nc.Device) -> None:
    label = f"shape {x.shape}, steps {steps}"
    expected = _apply(x, steps)
    node = ag.tensor(x, requires_grad=True, device=device)
    with profile() as prof:
        view = _apply(node, steps)
    launched = [e.name for e in prof.events() if e.kind != "range"]
    assert launched == [], f"{label}: making the view launched {launched}"
    assert view.shape == expected.shape, f"{label}: shape {view.shape}, expected {expected.shape}"
    np.testing.assert_array_equal(view.to_host(), expected, err_msg=label)
    np.testing.assert_array_equal((view * 2.0).to_host(), expected * np.float32(2.0), err_msg=label)
    with ag.no_grad():  # the kernels read the view through its strides, beside a plain tensor and itself
        other = ag.tensor(w, device=device)
        np.testing.assert_array_equal((view - other).to_host(), expected - w, err_msg=f"{label}: view - tensor")
        np.testing.assert_array_equal((view * view).to_host(), expected * expected, err_msg=f"{label}: view * view")

    with ag.Tape() as tape:
        loss = ag.sum(_apply(node, steps) * ag.tensor(w, device=device))
    tape.backward(loss)
    reference = np.zeros_like(x)
    _apply(reference, steps)[...] = w  # NumPy writes through its view chain
    grad = node.grad.to_host() if node.grad is not None else np.zeros_like(x)
    np.testing.assert_array_equal(grad, reference, err_msg=f"{label}: gradient")

    ops.add_(node.value, 1.0)
    np.testing.assert_array_equal(view.to_host(), _apply(x + np.float32(1.0), steps), err_msg=f"{label}: alias")


def _scaled(fraction: float) -> settings:
    return settings(max_examples=max(1, int(settings.default.max_examples * fraction)))


@given(case=cases())
def test_fuzz_views_numpy_backend(case):
    run_case(*case, nc.get_device("cpu"))


@pytest.mark.skipif(not nc.usable_opencl_devices(), reason="no OpenCL device")
@_scaled(0.25)
@given(case=cases())
def test_fuzz_views_opencl(case):
    run_case(*case, nc.get_device("opencl"))
