"""torch's loss modules against float64 NumPy references, every reduction, class weights and ``pos_weight``; bad
arguments refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn as nn
from netcl.core import ShapeError

RNG = np.random.default_rng(0)
A, B = RNG.normal(size=(4, 3)), RNG.normal(size=(4, 3))
PROBS, SOFT = RNG.uniform(0.05, 0.95, size=(4, 3)), RNG.uniform(size=(4, 3))
LOGITS, LABELS = RNG.normal(size=(6, 5)), np.array([0, 4, -100, 2, 1, 3])
WEIGHT, POS_WEIGHT = RNG.uniform(0.5, 2.0, size=(4, 1)), np.array([0.5, 3.0, 1.5])  # per row; per class (last axis)


def _log_softmax(x):
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _nll(logp, labels):
    kept = labels != -100
    return np.where(kept, -logp[np.arange(len(labels)), np.where(kept, labels, 0)], 0.0), kept


def _cross_entropy(x, labels, smoothing):
    logp = _log_softmax(x)
    nll, kept = _nll(logp, labels)
    return np.where(kept, (1 - smoothing) * nll - smoothing * logp.mean(axis=1), 0.0), kept


def _smooth_l1(d, beta):
    return np.abs(d) if beta == 0 else np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta)


#: name -> (module factory by reduction, prediction, target, whether the target holds class indices)
CASES = {
    "mse": (lambda r: nn.MSELoss(reduction=r), A, B, False),
    "l1": (lambda r: nn.L1Loss(reduction=r), A, B, False),
    "smooth_l1": (lambda r: nn.SmoothL1Loss(reduction=r, beta=0.5), A, B, False),
    "smooth_l1_beta0": (lambda r: nn.SmoothL1Loss(r, beta=0.0), A, B, False),
    "bce": (lambda r: nn.BCELoss(reduction=r), PROBS, SOFT, False),
    "bce_logits": (lambda r: nn.BCEWithLogitsLoss(reduction=r), 3 * A, SOFT, False),
    "bce_logits_weighted": (
        lambda r: nn.BCEWithLogitsLoss(WEIGHT, reduction=r, pos_weight=POS_WEIGHT),
        3 * A,
        SOFT,
        False,
    ),
    "huber": (lambda r: nn.HuberLoss(r, delta=0.7), A, B, False),
    "kl_div": (lambda r: nn.KLDivLoss(r), A, SOFT, False),
    "nll": (lambda r: nn.NLLLoss(reduction=r), LOGITS, LABELS, True),
    "cross_entropy": (lambda r: nn.CrossEntropyLoss(reduction=r, label_smoothing=0.1), LOGITS, LABELS, True),
}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", list(CASES))
def test_loss_module_matches_reference(device, name, reduction):
    """Forward against the float64 reference (a mean over the rows not ignored for the class losses);
    the gradient of sum(loss * w) against finite differences of that reference."""
    make, pred, target, integer = CASES[name]
    module = make(reduction)
    p = ag.tensor(pred.astype(np.float32), requires_grad=True, device=device)
    t = ag.tensor(target.astype(np.int32 if integer else np.float32), device=device)
    out = module(p, t)

    def reduce(values, kept):
        if reduction == "none":
            return values
        if reduction == "sum":
            return values.sum()
        return values.sum() / (kept.sum() if kept is not None else values.size)

    np.testing.assert_allclose(out.to_host(), reduce(*_reference_at(name, pred, target)), rtol=1e-5, atol=1e-6)
    weights = np.linspace(0.5, 1.5, out.size).reshape(out.shape)
    ag.sum(out * ag.tensor(weights.astype(np.float32), device=device)).backward()
    numeric, eps = np.zeros_like(pred), 1e-6
    for index in np.ndindex(pred.shape):
        for sign in (1, -1):
            moved = pred.copy()
            moved[index] += sign * eps
            values = _reference_at(name, moved, target)
            numeric[index] += sign * (reduce(*values) * weights).sum() / (2 * eps)
    np.testing.assert_allclose(p.grad.to_host(), numeric, rtol=1e-4, atol=1e-5)


def _reference_at(name: str, pred: np.ndarray, target: np.ndarray):
    """Case ``name``'s elementwise float64 reference at ``pred`` and the rows kept (class losses) or None."""
    if name == "mse":
        return (pred - target) ** 2, None
    if name == "l1":
        return np.abs(pred - target), None
    if name.startswith("smooth_l1"):
        return _smooth_l1(pred - target, 0.5 if name == "smooth_l1" else 0.0), None
    if name == "bce":
        return -(target * np.log(pred) + (1 - target) * np.log(1 - pred)), None
    if name == "bce_logits":
        return np.maximum(pred, 0) - pred * target + np.log1p(np.exp(-np.abs(pred))), None
    if name == "bce_logits_weighted":  # torch's: w ((1 - t) softplus(x) + pos_weight t softplus(-x))
        softplus = np.maximum(pred, 0) + np.log1p(np.exp(-np.abs(pred)))
        return WEIGHT * ((1 - target) * softplus + POS_WEIGHT * target * (softplus - pred)), None
    if name == "kl_div":  # log-probability inputs, probability targets
        return target * (np.log(target) - pred), None
    if name == "huber":
        d = pred - target
        return np.where(np.abs(d) < 0.7, 0.5 * d * d, 0.7 * (np.abs(d) - 0.35)), None
    if name == "nll":
        return _nll(pred, target)
    return _cross_entropy(pred, target, 0.1)


CLASS_WEIGHTS = np.array([0.5, 2.0, 1.0, 3.0, 0.25])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("spatial", [False, True])
def test_class_weights_follow_torchs_normalization(device, reduction, smoothing, spatial):
    """CrossEntropyLoss(weight=w): each kept position's loss weighed by w[y] (smoothed: plus s / C of the w-weighted
    sum over classes), ignored positions add nothing, the mean divides by the sum of w[y] over the kept ones;
    (N, C, d) inputs as (N * d, C); gradients by central differences of the float64 reference."""
    logits = RNG.normal(size=(3, 5, 4)) if spatial else LOGITS
    labels = np.array([[0, 4, -100, 2], [1, 3, 3, -100], [2, 2, 0, 1]]) if spatial else LABELS
    module = nn.CrossEntropyLoss(weight=CLASS_WEIGHTS, reduction=reduction, label_smoothing=smoothing)

    def reference(x):
        rows = np.moveaxis(x, 1, -1).reshape(-1, 5) if spatial else x
        flat = labels.reshape(-1)
        logp, kept = _log_softmax(rows), flat != -100
        safe = np.where(kept, flat, 0)
        w_target = CLASS_WEIGHTS[safe] * kept
        loss = -logp[np.arange(len(flat)), safe] * w_target
        loss = (1 - smoothing) * loss - smoothing / 5 * (logp * CLASS_WEIGHTS).sum(axis=1) * kept
        if reduction == "none":
            return loss.reshape(labels.shape)
        return loss.sum() if reduction == "sum" else loss.sum() / w_target.sum()

    p = ag.tensor(logits.astype(np.float32), requires_grad=True, device=device)
    out = module(p, ag.tensor(labels.astype(np.int32), device=device))
    assert out.dtype == np.float32  # the float64 weights take the logits' dtype, as torch asks of them
    np.testing.assert_allclose(out.to_host(), reference(logits), rtol=1e-5, atol=1e-6)
    weights = np.linspace(0.5, 1.5, out.size).reshape(out.shape)
    ag.sum(out * ag.tensor(weights.astype(np.float32), device=device)).backward()
    numeric = np.zeros_like(logits)
    for index in np.ndindex(logits.shape):
        up, down = logits.copy(), logits.copy()
        up[index] += 1e-6
        down[index] -= 1e-6
        numeric[index] = ((reference(up) - reference(down)) * weights).sum() / 2e-6
    np.testing.assert_allclose(p.grad.to_host(), numeric, rtol=1e-4, atol=1e-5)


def test_unsupported_arguments_are_refused_by_name():
    with pytest.raises(ShapeError, match=r"class weight must have shape \(5,\)"):
        nn.CrossEntropyLoss(weight=np.ones(3))(ag.tensor(LOGITS.astype(np.float32)), LABELS.astype(np.int32))
    with pytest.raises(ShapeError, match=r"pos_weight of shape \(2,\) does not broadcast to \(4, 3\)"):
        nn.BCEWithLogitsLoss(pos_weight=np.ones(2))(ag.tensor(A.astype(np.float32)), ag.tensor(SOFT.astype(np.float32)))
    with pytest.raises(ValueError, match="HuberLoss: delta must be > 0, got -1"):
        nn.HuberLoss(delta=-1)
    with pytest.raises(ValueError, match=r"MSELoss: reduction must be one of \('mean', 'sum', 'none'\), got 'avg'"):
        nn.MSELoss(reduction="avg")
