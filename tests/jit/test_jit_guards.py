"""jit_compile guards on captured tensors and module modes: rebinding what the function reads, or
switching a module it reads between train() and eval(), re-traces.

A jitted function that reads a tensor which is not an argument bakes that tensor into its plan.
Rebinding the closure variable, module global, attribute or dict entry it came from must give
the new tensor's result on the next call (the plan is traced again), an in-place update of the
captured buffer must be seen without a new trace, and a capture netcl cannot watch warns once.
Results are compared with float64 NumPy: one or two float32 ops per element, so rtol 1e-6.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn as nn
from netcl.jit import RetraceWarning, UnwatchedCaptureWarning, jit_compile
from netcl.runtime import ops as R

RTOL = 1e-6
X = np.linspace(-2.0, 2.0, 12, dtype=np.float32).reshape(3, 4)


def const(value, device, shape=(3, 4)):
    return ag.tensor(np.full(shape, value, np.float32), device=device)


def check(result, expected):
    np.testing.assert_allclose(result.to_host(), np.asarray(expected, np.float64), rtol=RTOL)


def fused_once(fn) -> None:
    """The jitted function ran fused (no fallback) and traced again exactly once per rebinding."""
    info = fn.cache_info()
    assert info["fallbacks"] == 0 and info["entries"] == 1, info


def test_rebinding_a_closure_variable_retraces(device):
    x = ag.tensor(X, device=device)
    c = const(1.0, device)
    fn = jit_compile(lambda t: ag.relu(t * c) + c)
    check(fn(x), np.maximum(X, 0) + 1.0)
    c = const(-3.0, device)
    check(fn(x), np.maximum(X.astype(np.float64) * -3.0, 0) - 3.0)
    check(fn(x), np.maximum(X.astype(np.float64) * -3.0, 0) - 3.0)  # a cache hit again
    assert fn.cache_info()["retraces"] == 1
    fused_once(fn)


SCALE = None


def _scaled(t):
    return ag.tanh(t * SCALE)


def test_rebinding_a_module_global_retraces(device):
    global SCALE
    x = ag.tensor(X, device=device)
    SCALE = const(0.5, device)
    fn = jit_compile(_scaled)
    check(fn(x), np.tanh(X * 0.5))
    SCALE = const(2.0, device, shape=(4,))  # another shape too: the plan is rebuilt for it
    check(fn(x), np.tanh(X.astype(np.float64) * 2.0))
    assert fn.cache_info()["retraces"] == 1
    fused_once(fn)


class Affine:
    """A model-like object: the jitted call reads its attributes and a dict of extra terms."""

    def __init__(self, w, b):
        self.w = w
        self.extra = {"b": b}

    def __call__(self, t):
        return ag.sigmoid(t * self.w + self.extra["b"])


def test_rebinding_an_attribute_or_dict_entry_retraces(device):
    x = ag.tensor(X, device=device)
    model = Affine(const(1.0, device), const(0.0, device))
    fn = jit_compile(model)
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    check(fn(x), sig(X.astype(np.float64)))
    model.w = const(2.0, device)
    check(fn(x), sig(2.0 * X.astype(np.float64)))
    model.extra["b"] = const(-1.0, device)
    check(fn(x), sig(2.0 * X.astype(np.float64) - 1.0))
    assert fn.cache_info()["retraces"] == 2
    fused_once(fn)


def test_attribute_of_an_argument_and_of_self_in_a_bound_method(device):
    class Holder:
        def __init__(self, c):
            self.c = c

        def forward(self, t):
            return t * self.c

    x = ag.tensor(X, device=device)
    holder = Holder(const(2.0, device))
    as_argument = jit_compile(lambda h, t: ag.relu(t + h.c))  # h is a static argument
    bound = jit_compile(holder.forward)
    check(as_argument(holder, x), np.maximum(X + 2.0, 0))
    check(bound(x), X * 2.0)
    holder.c = const(-1.0, device)
    check(as_argument(holder, x), np.maximum(X.astype(np.float64) - 1.0, 0))
    check(bound(x), -X.astype(np.float64))


def test_in_place_update_of_a_captured_buffer_is_seen_without_a_retrace(device):
    x = ag.tensor(X, device=device)
    c = const(1.0, device)
    fn = jit_compile(lambda t: t * c + 1.0)
    check(fn(x), X + 1.0)
    R.add_(c.value, 2.0)  # c is still the same tensor, its buffer now holds 3
    check(fn(x), X.astype(np.float64) * 3.0 + 1.0)
    assert fn.cache_info()["retraces"] == 0 and fn.cache_info()["misses"] == 1


def test_fused_gradient_follows_the_rebound_tensor(device):
    x = ag.tensor(X, requires_grad=True, device=device)
    c = const(2.0, device)
    fn = jit_compile(lambda t: t * t * c)
    ag.sum(fn(x)).backward()
    np.testing.assert_allclose(x.grad.to_host(), 4.0 * X, rtol=RTOL)
    c = const(-0.5, device)
    x.grad = None
    ag.sum(fn(x)).backward()
    np.testing.assert_allclose(x.grad.to_host(), -1.0 * X, rtol=RTOL)


def _fresh(device):
    return const(5.0, device)


def test_unwatchable_capture_warns_once_naming_shape_and_line(device):
    x = ag.tensor(X, device=device)
    fn = jit_compile(lambda t: t + _fresh(device))  # made by a call: nothing to watch
    with pytest.warns(UnwatchedCaptureWarning) as record:
        check(fn(x), X + 5.0)
    (warning,) = [w for w in record if issubclass(w.category, UnwatchedCaptureWarning)]
    message = str(warning.message)
    assert "(3, 4) float32 tensor" in message and "Pass it as an argument" in message
    assert "test_jit_guards.py" in warning.filename and "_fresh(device)" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnwatchedCaptureWarning)
        check(fn(x), X + 5.0)  # a cache hit: no new warning
        y = ag.tensor(np.ones(4, np.float32), device=device)
        check(fn(y), np.full((3, 4), 6.0))  # another signature: traced again, no second warning
    assert fn.cache_info()["misses"] == 2 and fn.cache_info()["retraces"] == 0


def test_watched_captures_do_not_warn(device):
    x = ag.tensor(X, device=device)
    c = const(1.0, device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnwatchedCaptureWarning)
        check(jit_compile(lambda t: t - c)(x), X - 1.0)


def test_a_module_switched_between_train_and_eval_retraces(device):
    """BatchNorm and Dropout read their module's training flag while tracing: the plan follows train()/eval()
    (float64 reference of BatchNorm's two modes; eval-mode dropout is the identity, exactly)."""
    bn, drop = nn.BatchNorm1d(3, device=device), nn.Dropout(0.5)
    x = ag.tensor(X.T.copy(), device=device)  # (4, 3): 4 samples of 3 features
    normalized = jit_compile(lambda t: bn(t) * 2.0)
    dropped = jit_compile(lambda t: drop(t) + 1.0)
    x64 = X.T.astype(np.float64)
    mean, var = x64.mean(0), x64.var(0)
    with ag.no_grad():
        check(normalized(x), 2 * (x64 - mean) / np.sqrt(var + bn.eps))
        bn.eval()
        running_mean, running_var = 0.1 * mean, 0.9 + 0.1 * x64.var(0, ddof=1)
        check(normalized(x), 2 * (x64 - running_mean) / np.sqrt(running_var + bn.eps))
        bn.train()
        check(normalized(x), 2 * (x64 - mean) / np.sqrt(var + bn.eps))
        assert normalized.cache_info()["retraces"] == 2
        kept = dropped(x).to_host()
        assert (kept == 1.0).any() and (kept != 1.0).any()  # training: some dropped, the rest scaled
        drop.eval()
        np.testing.assert_array_equal(dropped(x).to_host(), X.T + np.float32(1.0))


class Scaled:
    """A callable object whose number the kernel bakes in (``self.k``)."""

    def __init__(self, k):
        self.k = k

    def __call__(self, t):
        return t * self.k


def test_a_baked_python_number_that_changes_retraces(device):
    """``x * scale`` bakes the number into the kernel: changing the global, the attribute or the dict entry
    it came from re-traces; a number passed as an argument is a kernel argument (no re-trace)."""
    global SCALE
    x = ag.tensor(X, device=device)
    SCALE = 2.0
    by_global = jit_compile(lambda t: t * SCALE + 1.0)
    config = {"shift": 1.0}
    by_item = jit_compile(lambda t: ag.relu(t - config["shift"]))
    by_attribute = jit_compile(Scaled(3.0))
    check(by_global(x), X * 2.0 + 1.0)
    check(by_item(x), np.maximum(X - 1.0, 0.0))
    check(by_attribute(x), X * 3.0)
    SCALE, config["shift"], by_attribute.fn.k = 5.0, -0.5, 0.25
    check(by_global(x), X * 5.0 + 1.0)
    check(by_item(x), np.maximum(X + 0.5, 0.0))
    check(by_attribute(x), X * 0.25)
    assert [f.cache_info()["retraces"] for f in (by_global, by_item, by_attribute)] == [1, 1, 1]
    as_argument = jit_compile(lambda t, s: t * s)
    for s in (2.0, 3.0, 4.0):
        check(as_argument(x, s), X * s)
    assert as_argument.cache_info()["retraces"] == 0 and as_argument.cache_info()["entries"] == 1


def test_a_number_that_changes_on_every_call_warns_once(device):
    x = ag.tensor(X, device=device)
    scaled = jit_compile(Scaled(1.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(12):
            scaled.fn.k = float(step)
            check(scaled(x), X * float(step))
    retrace = [w for w in caught if issubclass(w.category, RetraceWarning)]
    assert len(retrace) == 1 and "traced again 8 times" in str(retrace[0].message)


def test_a_baked_shape_number_that_changes_retraces(device):
    """``t.reshape(ROWS, -1)`` bakes ROWS into the plan: a new value re-traces (the old plan would give the old
    shape)."""
    global ROWS
    x = ag.tensor(np.arange(12, dtype=np.float32), device=device)
    ROWS = 3
    reshaped = jit_compile(lambda t: ag.reshape(t, (ROWS, -1)) * 2.0)
    assert reshaped(x).shape == (3, 4)
    ROWS = 2
    result = reshaped(x)
    assert result.shape == (2, 6)
    check(result, np.arange(12).reshape(2, 6) * 2.0)


class Strided:
    """Two attributes holding the same small int (one object in CPython): each path is watched."""

    def __init__(self):
        self.unused = 3
        self.rows = 3

    def __call__(self, t):
        return ag.reshape(t, (self.rows, -1)) + 1.0


def test_every_path_to_an_equal_small_int_is_watched(device):
    x = ag.tensor(np.arange(12, dtype=np.float32), device=device)
    shaped = jit_compile(Strided())
    assert shaped(x).shape == (3, 4)
    shaped.fn.rows = 4
    assert shaped(x).shape == (4, 3)


class Runner:
    """A loop object whose loss method the jitted step calls, and whose step counter its loop advances (as a
    Trainer's): the counter is no number of the plan."""

    def __init__(self):
        self.steps = 0

    def loss(self, t):
        return ag.sum(ag.reshape(t, (3, -1)) * 2.0, axis=1)


def test_a_counter_of_an_object_behind_a_method_does_not_retrace(device):
    """Ints three or more steps away (``loss_fn.__self__.steps``) are not watched: a counter walking through
    the small ints the trace holds (3, 1, ...) would re-trace every call."""
    x = ag.tensor(np.arange(12, dtype=np.float32), device=device)
    runner = Runner()
    loss_fn = runner.loss
    step = jit_compile(lambda t: loss_fn(t))
    for _ in range(6):
        runner.steps += 1  # 1, 2, 3, ...: among them the plan's axis (1) and reshape (3)
        check(step(x), np.arange(12).reshape(3, 4).sum(axis=1) * 2.0)
    assert step.cache_info()["retraces"] == 0
