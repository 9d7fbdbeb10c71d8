"""The device-side scalar log (log_scalar_), the global generator's state and counters_start_at."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.core.errors import DTypeError
from netcl.runtime.capture import capture_graph
from netcl.runtime.ops import random as RR
from netcl.runtime.ops.scalar_log import log_scalar_


def _one(device, value, dtype=np.float32):
    return nc.Tensor.from_host(device, np.asarray([value], dtype))


def test_log_scalar_appends_accumulates_and_reports_overflow(device):
    log = nc.Tensor.zeros((3,), np.float32, device)
    pos = nc.Tensor.zeros((1,), np.int32, device)
    ones, four = _one(device, 1.0), _one(device, 4.0)
    log_scalar_(log, pos, _one(device, 0.75), ones)
    log_scalar_(log, pos, _one(device, 2.0), four, weight=0.5, advance=False)  # accumulates in slot 1
    log_scalar_(log, pos, _one(device, 6.0), four, weight=0.5)
    log_scalar_(log, pos, _one(device, 0.1, np.float64), ones)
    log_scalar_(log, pos, _one(device, 9.0), ones)  # past the end: nothing written, the position still moves
    np.testing.assert_array_equal(log.to_host(), np.float32([0.75, 0.25 + 0.75, np.float32(0.1)]))
    assert int(pos.to_host()[0]) == 4


def test_log_scalar_bad_inputs(device):
    log = nc.Tensor.zeros((3,), np.float32, device)
    pos = nc.Tensor.zeros((1,), np.int32, device)
    ones = _one(device, 1.0)
    with pytest.raises(DTypeError, match="log must be a 1-d float32"):
        log_scalar_(nc.Tensor.zeros((3,), np.int32, device), pos, ones, ones)
    with pytest.raises(DTypeError, match="position must be a one-element int32"):
        log_scalar_(log, nc.Tensor.zeros((2,), np.int32, device), ones, ones)
    with pytest.raises(DTypeError, match="value must be a one-element"):
        log_scalar_(log, pos, nc.Tensor.zeros((2,), np.float32, device), ones)
    with pytest.raises(DTypeError, match="divisor must be a one-element float32"):
        log_scalar_(log, pos, ones, _one(device, 1, np.int32))


def test_rng_state_round_trips_and_rejects_bad_states():
    RR.manual_seed(11)
    RR.next_seed()
    state = RR.get_rng_state()
    assert state == {"seed": 11, "calls": 1}
    expected = [RR.next_seed() for _ in range(3)]
    RR.set_rng_state(state)
    assert [RR.next_seed() for _ in range(3)] == expected
    for bad in ({"seed": 1}, {"seed": -1, "calls": 0}, {"seed": 1, "calls": -2}, None):
        with pytest.raises(ValueError, match="set_rng_state"):
            RR.set_rng_state(bad)
    assert RR.get_rng_state() == {"seed": 11, "calls": 4}


def test_counters_start_at_gives_a_recapture_the_masks_of_a_later_replay(cl_device):
    """A graph with an advancing counter: its n-th run draws mask n; a graph captured again under
    counters_start_at(n) draws, at its capture, the mask of the first graph's (n+1)-th run."""
    x = nc.Tensor.from_host(cl_device, np.ones(4096, np.float32))
    seed = 1234

    def step():
        counter = RR.advance_counter(RR.new_counter(cl_device))
        return RR.dropout(x, 0.5, seed, counter)

    first = capture_graph(cl_device.queue, step)
    masks = [first.outputs.to_host().copy()]  # the capture's own run: counter 1
    for _ in range(3):
        masks.append(first.execute().to_host().copy())  # counters 2, 3, 4
    assert all(not np.array_equal(masks[0], m) for m in masks[1:])
    with RR.counters_start_at(2):
        again = capture_graph(cl_device.queue, step)
    np.testing.assert_array_equal(again.outputs.to_host(), masks[2])  # counter 3, as the 2nd replay
    with pytest.raises(ValueError, match="counters_start_at"), RR.counters_start_at(-1):
        pass
