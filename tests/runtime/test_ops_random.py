"""Counter-based random numbers: reproducible, identical across backends, statistically sound.

Statistics use n = 2**20 samples, with bounds of 5 standard errors (a false failure has
probability < 1e-6 for a good generator; the seeds are fixed anyway, so the test is
deterministic and fails only when the generator or the transform is wrong):
- uniform[0,1): mean 1/2, SE sqrt(1/12 / n) = 2.8e-4; std sqrt(1/12) = 0.2887, SE ~1.3e-4.
- normal(0,1): mean 0, SE 1/sqrt(n) = 9.8e-4; std 1, SE 1/sqrt(2n) = 6.9e-4.
- neighbouring elements: correlation 0, SE 1/sqrt(n) = 9.8e-4 (catches a weak counter hash).
Cross-backend: uniform is bit-identical (exact integer hash, exact scaling, contraction off);
normal goes through log/cos, which OpenCL computes within 4 ulp, so |z| <= 5.8 agrees to
rtol 1e-5 / atol 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import ops
from netcl.runtime.ops import random

N = 1 << 20
SIGMAS = 5


def test_philox_known_answers() -> None:
    """Known-answer vectors of Philox4x32-10 (Random123's kat_vectors)."""
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    for counter, key, expected in cases:
        words = random.philox4x32([np.array([c], np.uint32) for c in counter], key)
        assert tuple(int(w[0]) for w in words) == expected


def test_reproducible_and_seed_dependent(device: nc.Device) -> None:
    a = ops.uniform((1000,), seed=7, device=device).to_host()
    b = ops.uniform((1000,), seed=7, device=device).to_host()
    c = ops.uniform((1000,), seed=8, device=device).to_host()
    np.testing.assert_array_equal(a, b)
    assert np.mean(a == c) < 0.01
    normal = ops.normal((1000,), seed=7, device=device).to_host()
    assert abs(np.corrcoef(a, normal)[0, 1]) < SIGMAS / np.sqrt(1000)  # separate streams


def test_same_numbers_on_every_backend(cl_device: nc.Device) -> None:
    shape = (3, 1000)
    cl_uniform = ops.uniform(shape, -2.0, 5.0, seed=123, device=cl_device).to_host()
    np_uniform = ops.uniform(shape, -2.0, 5.0, seed=123, device="cpu").to_host()
    np.testing.assert_array_equal(cl_uniform, np_uniform)
    big_seed = 2**40 + 5
    cl_normal = ops.normal(shape, 1.0, 3.0, seed=big_seed, device=cl_device).to_host()
    np_normal = ops.normal(shape, 1.0, 3.0, seed=big_seed, device="cpu").to_host()
    np.testing.assert_allclose(cl_normal, np_normal, rtol=1e-5, atol=3e-5)  # atol scaled by std = 3


def test_uniform_statistics(device: nc.Device) -> None:
    u = ops.uniform((N,), seed=11, device=device).to_host().astype(np.float64)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < SIGMAS * np.sqrt(1 / 12 / N)
    assert abs(u.std() - np.sqrt(1 / 12)) < SIGMAS * 1.3e-4
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < SIGMAS / np.sqrt(N)
    scaled = ops.uniform((1000,), low=-3.0, high=-1.0, seed=11, device=device).to_host()
    np.testing.assert_allclose(scaled, -3.0 + 2.0 * u[:1000], rtol=1e-6, atol=0)


def test_normal_statistics(device: nc.Device) -> None:
    z = ops.normal((N,), seed=12, device=device).to_host().astype(np.float64)
    assert abs(z.mean()) < SIGMAS / np.sqrt(N)
    assert abs(z.std() - 1.0) < SIGMAS / np.sqrt(2 * N)
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < SIGMAS / np.sqrt(N)
    assert np.abs(z).max() < 5.8  # Box-Muller with u1 >= 2**-24 bounds |z| by sqrt(-2 log 2**-24)
    shifted = ops.normal((1000,), mean=2.0, std=0.5, seed=12, device=device).to_host()
    np.testing.assert_allclose(shifted, 2.0 + 0.5 * z[:1000], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(0,), (), (2, 0, 3)])
def test_degenerate_shapes(device: nc.Device, shape: tuple[int, ...]) -> None:
    assert ops.uniform(shape, device=device).to_host().shape == shape
    assert ops.normal(shape, device=device).shape == shape


def test_draws_not_taken_leave_the_generator_and_other_threads_alone():
    """A jit trace's seed draws (``draws_not_taken``) are distinct within the block, do not advance the global
    generator, and a draw on another thread meanwhile takes the generator's next seed as usual."""
    import threading

    from netcl.runtime.ops import random as R

    R.manual_seed(5)
    expected = [R.next_seed() for _ in range(3)]
    R.manual_seed(5)
    other: list[int] = []
    with R.draws_not_taken():
        inside = [R.next_seed(), R.next_seed()]
        thread = threading.Thread(target=lambda: other.append(R.next_seed()))
        thread.start()
        thread.join()
    assert inside == expected[:2] and other == [expected[0]]
    assert [R.next_seed(), R.next_seed()] == expected[1:]
