"""``broadcast_shapes`` against NumPy, and ``broadcast_index_lines`` evaluated on the host."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import netcl.core as nc

RNG_SEED = 20240611


def _random_shape(rng: np.random.Generator, base: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that often, but not always, broadcasts with ``base``: dims drawn from base, 1, 0 and others."""
    ndim = int(rng.integers(0, 5))
    dims = []
    for axis in range(ndim):
        source = base[axis - ndim] if ndim - axis <= len(base) else 1
        dims.append(int(rng.choice([source, source, 1, 0, rng.integers(2, 5)])))
    return tuple(dims)


def _shape_sets(count: int) -> list[tuple[tuple[int, ...], ...]]:
    rng = np.random.default_rng(RNG_SEED)
    sets = []
    for _ in range(count):
        base = tuple(int(d) for d in rng.integers(0, 5, int(rng.integers(0, 5))))
        arity = int(rng.integers(1, 4))
        sets.append(tuple(_random_shape(rng, base) for _ in range(arity)))
    return sets


def _numpy_broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def test_broadcast_shapes_matches_numpy_on_random_shapes() -> None:
    outcomes = {"ok": 0, "error": 0, "zero": 0}
    for shapes in _shape_sets(3000):
        expected = _numpy_broadcast(*shapes)
        if expected is None:
            outcomes["error"] += 1
            listed = re.escape(", ".join(str(s) for s in shapes))
            with pytest.raises(nc.ShapeError, match=f"shapes {listed} cannot broadcast: axis -"):
                nc.broadcast_shapes(*shapes)
        else:
            outcomes["ok"] += 1
            outcomes["zero"] += 0 in expected
            assert nc.broadcast_shapes(*shapes) == expected, shapes
    # the generator really covers success, failure and zero-size results
    assert min(outcomes.values()) > 200, outcomes


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        ((), ()),
        (((),), ()),
        (((5, 1), (1, 7)), (5, 7)),
        (((2, 1, 4), (3, 1)), (2, 3, 4)),
        (((), (5,)), (5,)),
        (((0,), (1,)), (0,)),
        (((1, 0), (3, 1)), (3, 0)),
        (((2, 3), [1, 3], (1, 1, 1)), (1, 2, 3)),
        ((3, (2, 1)), (2, 3)),  # ints are 1-d shapes, as in NumPy
        (((np.int64(4), 1), (4,)), (4, 4)),
    ],
)
def test_broadcast_shapes_cases(shapes: tuple, expected: tuple[int, ...]) -> None:
    assert nc.broadcast_shapes(*shapes) == expected == tuple(np.broadcast_shapes(*shapes))


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (((2, 3), (4,)), r"shapes \(2, 3\), \(4,\) cannot broadcast: axis -1 has sizes \[3, 4\]"),
        (((0,), (3,)), r"shapes \(0,\), \(3,\) cannot broadcast: axis -1 has sizes \[0, 3\]"),
        (
            ((2, 1), (1, 3), (4, 3)),
            r"shapes \(2, 1\), \(1, 3\), \(4, 3\) cannot broadcast: axis -2 has sizes \[1, 2, 4\]",
        ),
        (((2, -1), (2, 1)), r"negative dimension -1"),
        (((2.5,), (1,)), r"non-integer dimension 2\.5"),
    ],
)
def test_broadcast_shapes_errors(shapes: tuple, match: str) -> None:
    with pytest.raises(nc.ShapeError, match=match):
        nc.broadcast_shapes(*shapes)


def test_shape_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="cannot broadcast"):
        nc.broadcast_shapes((2,), (3,))


def _eval_index_lines(lines: list[str], in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> np.ndarray:
    """Run the generated C statement for every output index (C ``/`` on non-negatives is ``//``)."""
    (line,) = lines
    match = re.fullmatch(r"(int|long) src = (.+);", line)
    assert match, line
    expr = match.group(2).replace("/", "//")
    assert re.fullmatch(r"[\w\s()*+%/]+", expr), expr  # nothing but index arithmetic
    return np.array([eval(expr, {}, {"gid": i}) for i in range(math.prod(out_shape))], dtype=np.int64)


def _numpy_source_index(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> np.ndarray:
    """For each flat output index, the flat index NumPy broadcasting reads from the input."""
    return np.broadcast_to(np.arange(math.prod(in_shape)).reshape(in_shape), out_shape).reshape(-1)


def test_index_lines_match_numpy_on_random_shapes() -> None:
    checked = 0
    for shapes in _shape_sets(600):
        out_shape = _numpy_broadcast(*shapes)
        if out_shape is None or math.prod(out_shape) > 400:
            continue
        for in_shape in shapes:
            lines = nc.broadcast_index_lines(in_shape, out_shape, "gid", "src")
            got = _eval_index_lines(lines, in_shape, out_shape)
            np.testing.assert_array_equal(got, _numpy_source_index(in_shape, out_shape), err_msg=f"{in_shape}")
            checked += 1
    assert checked > 300


def test_index_lines_shortcuts_and_index_type() -> None:
    assert nc.broadcast_index_lines((3, 4), (3, 4), "i", "j") == ["int j = i;"]
    assert nc.broadcast_index_lines((4,), (1, 4), "i", "j") == ["int j = i;"]  # same elements, same order
    assert nc.broadcast_index_lines((), (5, 2), "i", "j") == ["int j = 0;"]
    assert nc.broadcast_index_lines((1, 1), (5, 2), "i", "j", "long") == ["long j = 0;"]
    assert nc.broadcast_index_lines((1, 7), (5, 7), "gid", "ib") == ["int ib = (gid % 7);"]
    assert nc.broadcast_index_lines((5, 1), (5, 7), "gid", "ia", "long") == ["long ia = (gid / 7);"]


@pytest.mark.parametrize(
    ("in_shape", "out_shape"),
    [((3,), (4,)), ((2, 3), (3,)), ((4, 1), (1, 4)), ((2,), ())],
)
def test_index_lines_reject_inputs_that_do_not_broadcast_to_output(in_shape, out_shape) -> None:
    with pytest.raises(nc.ShapeError, match=r"does not broadcast to output shape|cannot broadcast"):
        nc.broadcast_index_lines(in_shape, out_shape, "i", "j")


def test_contiguous_strides_and_64bit_index() -> None:
    assert nc.contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert nc.contiguous_strides(()) == ()
    assert not nc.needs_64bit_index((2**15, 2**15), (3,))
    assert nc.needs_64bit_index((3,), (2**16, 2**15))
