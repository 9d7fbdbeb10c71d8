"""What a tile search times: a code epilogue's product under its own key with the epilogue in every trial, a
split product with one workspace for all its timed runs; and what it builds ahead of its trials, on threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import tune
from netcl.runtime.cache import program_cache
from netcl.runtime.ops import gemm, gemm_configs, gemm_plan
from netcl.runtime.ops.gemm_source import Epilogue, GemmConfig


def test_a_code_epilogue_searches_with_the_epilogue_under_its_own_key(cl_device, two_tiles, monkeypatch):
    planned: list[Epilogue] = []
    make_plan = gemm_configs.make_plan

    def spy(device, dtype, out_dtype, out_shape, problem, epilogue=gemm_configs.IDENTITY, **kw):
        planned.append(epilogue)
        return make_plan(device, dtype, out_dtype, out_shape, problem, epilogue, **kw)

    monkeypatch.setattr(gemm_configs, "make_plan", spy)
    rng = np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, (40, 48)).astype(np.float32), rng.uniform(-1, 1, (48, 24)).astype(np.float32)
    col = rng.uniform(-1, 1, 24).astype(np.float32)
    ep = Epilogue(
        "col", code="float ep_out0 = tanh(ep_value) * ep0;\nfloat ep_out1 = ep_value;", operands=("col", "out")
    )
    saved = nc.Tensor.empty((40, 24), np.dtype("f4"), cl_device)
    bias = nc.tensor(col[::-1].copy(), device=cl_device)
    args = [nc.tensor(col, device=cl_device), saved]
    x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
    got = gemm.gemm(x, y, epilogue=ep, bias=bias, epilogue_args=args).to_host()

    assert planned and set(planned) == {ep}  # every trial ran the epilogue
    (key,) = tune.winners(cl_device)
    assert key == tune.shape_class("portable", 40, 24, 48, False, "NN", "<f4") + f"|e{gemm_configs.epilogue_digest(ep)}"
    # 48 products of magnitude <= 1 in float32, tanh within a few ulp: error well below 1e-5
    v = a.astype(np.float64) @ b.astype(np.float64) + col[::-1]
    np.testing.assert_allclose(saved.to_host(), v, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got, np.tanh(v) * col, rtol=0, atol=1e-5)

    planned.clear()
    gemm.gemm(x, y)  # the same shape without an epilogue: its own search, trials without one
    assert set(planned) == {gemm_configs.IDENTITY}
    assert len(tune.winners(cl_device)) == 2


def test_epilogue_digests_are_stable_and_tell_epilogues_apart():
    relu = Epilogue(code="float ep_out0 = fmax(ep_value, 0.0f);")
    assert gemm_configs.epilogue_digest(relu) == gemm_configs.epilogue_digest(
        Epilogue(code="float ep_out0 = fmax(ep_value, 0.0f);")
    )
    assert gemm_configs.epilogue_digest(relu) != gemm_configs.epilogue_digest(
        Epilogue("col", code="float ep_out0 = fmax(ep_value, 0.0f);")
    )


def test_a_split_products_trial_times_one_workspace(cl_device, monkeypatch):
    """Every timed run of a split product's trial writes the one workspace made with its plan (a replay has
    one; a fresh block per run would time its first touch), and computes the product."""
    problem = gemm_plan.Problem(16, 24, 1536, False, False, ())
    cfg = GemmConfig(16, 16, 2, 2, 32, 4, 4, 2)
    assert gemm_plan.split_count(problem, cfg.bm, cfg.bn, cfg.bk, cl_device)[0] > 1
    made: list[nc.Tensor] = []
    new_work = gemm_plan.Plan.new_work
    monkeypatch.setattr(gemm_plan.Plan, "new_work", lambda self: made.append(new_work(self)) or made[-1])
    trial = gemm_configs._Trial(cl_device, problem, np.dtype(np.float32))
    run = trial(cfg)
    for _ in range(3):
        out = run()
    assert len(made) == 1 and made[0] is not None
    a, b = (t.to_host().astype(np.float64) for t in trial.operands[:2])
    # 1536 products of magnitude <= 1 summed in float32 partial sums: error well below 2e-4
    expected = a.reshape(16, 1536) @ b.reshape(1536, 24)
    np.testing.assert_allclose(out.to_host().reshape(16, 24), expected, rtol=0, atol=2e-4)


def test_a_convolutions_trial_makes_its_workspace_once(cl_device, monkeypatch):
    """The implicit-GEMM convolution's trial (its weight gradient, split along K here) also makes one
    workspace with its plan; its timed runs allocate none."""
    from netcl.runtime.ops import conv, conv_implicit

    made: list[nc.Tensor | None] = []
    new_work = gemm_plan.Plan.new_work
    monkeypatch.setattr(gemm_plan.Plan, "new_work", lambda self: made.append(new_work(self)) or made[-1])
    geo = conv.check_conv2d((8, 4, 16, 16), (6, 4, 3, 3), None, 1, 1, 1, 1)
    layer = conv_implicit._Layer("dw", cl_device, geo, 6, np.dtype(np.float32), False)
    run = layer(GemmConfig(8, 8, 2, 2, 16, 1, 1, 2))
    for _ in range(3):
        run()
    assert len(made) == 1 and made[0] is not None  # 6 x 36 outputs, K = 8 * 256: split along K


@pytest.fixture
def misses_after_builds(monkeypatch) -> list[int]:
    """The program cache's miss count at the end of each ``tune.build_ahead`` (a build or disk hit is a miss)."""
    ahead, counts = tune.build_ahead, []

    def counted(*args):
        ahead(*args)
        counts.append(program_cache.stats().misses)

    monkeypatch.setattr(tune, "build_ahead", counted)
    return counts


def test_a_search_builds_its_candidates_on_threads_and_its_trials_reuse_those_programs(
    cl_device, two_tiles, misses_after_builds, monkeypatch
):
    """``tune.search`` builds every candidate through the trial's ``build`` on worker threads before its first
    trial (``tune.build_ahead``), and those are the programs the trials run: the trials build nothing more."""
    threads: list[str] = []
    build = gemm_configs._Trial.build

    def spy(self, cfg):
        threads.append(threading.current_thread().name)
        return build(self, cfg)

    monkeypatch.setattr(gemm_configs._Trial, "build", spy)
    problem = gemm_plan.Problem(40, 24, 48, False, False, ())
    trial = gemm_configs._Trial(cl_device, problem, np.dtype(np.float32))
    trial._make_operands()  # (the scratch operands' own programs, before counting)
    before = program_cache.stats().misses
    best, _ = tune.search(cl_device, list(two_tiles), trial)
    assert best in two_tiles
    assert len(threads) == 2 and all(name.startswith("netcl-tune-build") for name in threads)
    assert misses_after_builds[0] > before  # the candidates' programs were built ahead ...
    assert program_cache.stats().misses == misses_after_builds[0]  # ... and the trials built nothing more


def test_a_convolutions_search_builds_its_candidates_ahead_too(cl_device, searching, misses_after_builds, monkeypatch):
    """The implicit convolution's trial (``conv_implicit._Layer``) builds its candidates ahead as well, the
    programs its trials then run (operand and output views included)."""
    from netcl.runtime.ops import conv, conv_implicit, host_blas

    monkeypatch.setenv(host_blas.ENV_VAR, "0")
    monkeypatch.setattr(conv_implicit, "_CANDIDATES", [(8, 8, 1, 1, 8), (8, 8, 2, 2, 8)])
    tune.trial_operand(16, np.float32, cl_device, 1)  # the scratch operands' programs, before counting
    x = nc.tensor(np.ones((2, 3, 6, 6), np.float32), device=cl_device)
    w = nc.tensor(np.ones((4, 3, 3, 3), np.float32), device=cl_device)
    geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
    y = conv_implicit.forward(x, w, None, geo).to_host()
    assert y[0, 0, 2, 2] == 27.0  # an interior pixel: 3 channels x 9 taps of ones
    assert len(misses_after_builds) == 1
    assert program_cache.stats().misses == misses_after_builds[0]


def test_a_trial_with_its_own_timer_is_ranked_by_it(cl_device):
    """``tune.search`` times a trial's runs with the trial's ``timed`` where it has one: the candidate its timer
    rates fastest wins, whatever the queue markers would say."""

    class Rated:
        def __call__(self, cfg):
            return lambda: cfg

        def timed(self, run):
            return {"slow": 2.0, "fast": 1.0, "middle": 1.5}[run()]

    best, ms = tune.search(cl_device, ["slow", "fast", "middle"], Rated(), warmup_ms=0)
    assert (best, ms) == ("fast", 1.0)


def test_a_whole_batch_convolution_trial_times_the_device_time_of_its_kernels(cl_device):
    """``conv._WholeBatchTrial.timed``: the summed device time of the run's kernels (the transpose, the product
    and the gather of ``gemm_backward_input``), as a profile around it records them."""
    from netcl.profiler import profile
    from netcl.runtime.ops import conv

    geo = conv.check_conv2d((4, 6, 12, 12), (8, 6, 3, 3), None, 2, 1, 1, 1)
    trial = conv._WholeBatchTrial(cl_device, geo, 8, "dx", np.dtype(np.float32))
    run = trial("gemm")
    run()  # built
    with profile(cl_device) as outer:
        ms = trial.timed(run)
    kernels = [event for event in outer.events() if event.kind == "kernel"]
    assert {event.name for event in kernels} >= {"netcl_col2im_rows"} and len(kernels) >= 3
    assert ms == pytest.approx(sum(event.self_device_time for event in outer.events()) / 1e3) and ms > 0
