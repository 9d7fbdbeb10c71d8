"""Transformer layers from one torch-keyed state_dict against float64 NumPy transcriptions of torch's
forward (post-norm and pre-norm, masks, relu and tanh-GELU), in evaluation mode (dropout off).

Same tolerance reasoning as test_multihead_attention.py, over a few more float32 stages: 1e-4.
"""

from __future__ import annotations

import math

import file_modules
import numpy as np
import pytest

import netcl.autograd as ag
from netcl import nn
from netcl.core import ShapeError

_mha = file_modules.load("tests/nn/test_multihead_attention.py", "netcl_mha_reference")
TOL = 1e-4
D, H, FF = 8, 2, 12


def _sub(state, prefix):
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _layer_norm(x, state, prefix, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * state[prefix + "weight"] + state[prefix + "bias"]


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _ff(x, state, act):
    h = act(x @ state["linear1.weight"].T + state["linear1.bias"])
    return h @ state["linear2.weight"].T + state["linear2.bias"]


def _attn(state, prefix, q, kv, mask, kpm, batch_first):
    return _mha.reference_mha(_sub(state, prefix), q, kv, kv, H, kpm=kpm, attn_mask=mask, batch_first=batch_first)[0]


def ref_encoder_layer(state, x, norm_first, act, mask=None, kpm=None, batch_first=True, prefix=""):
    s = _sub(state, prefix)
    if norm_first:
        n = _layer_norm(x, s, "norm1.")
        x = x + _attn(s, "self_attn.", n, n, mask, kpm, batch_first)
        return x + _ff(_layer_norm(x, s, "norm2."), s, act)
    x = _layer_norm(x + _attn(s, "self_attn.", x, x, mask, kpm, batch_first), s, "norm1.")
    return _layer_norm(x + _ff(x, s, act), s, "norm2.")


def ref_decoder_layer(state, x, memory, norm_first, act, tgt_mask=None, mem_kpm=None, batch_first=True):
    if norm_first:
        n = _layer_norm(x, state, "norm1.")
        x = x + _attn(state, "self_attn.", n, n, tgt_mask, None, batch_first)
        x = x + _attn(state, "multihead_attn.", _layer_norm(x, state, "norm2."), memory, None, mem_kpm, batch_first)
        return x + _ff(_layer_norm(x, state, "norm3."), state, act)
    x = _layer_norm(x + _attn(state, "self_attn.", x, x, tgt_mask, None, batch_first), state, "norm1.")
    x = _layer_norm(x + _attn(state, "multihead_attn.", x, memory, None, mem_kpm, batch_first), state, "norm2.")
    return _layer_norm(x + _ff(x, state, act), state, "norm3.")


def _load(rng, module):
    state = {k: rng.standard_normal(v.shape) * 0.3 for k, v in module.state_dict().items()}
    module.load_state_dict(state)
    module.eval()
    return {k: v.astype(np.float32).astype(np.float64) for k, v in state.items()}


def _x(rng, shape):
    return rng.standard_normal(shape).astype(np.float32).astype(np.float64)


def _activation(name):
    if name == "relu":
        return "relu", lambda x: np.maximum(x, 0)
    if name == "gelu":  # torch's string: the exact GELU
        return "gelu", lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    return nn.GELU(approximate="tanh"), _gelu_tanh


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "gelu"])
def test_encoder_layer_equals_reference(device, norm_first, act) -> None:
    rng = np.random.default_rng(1)
    module_act, ref_act = _activation(act)
    layer = nn.TransformerEncoderLayer(D, H, FF, activation=module_act, batch_first=True, norm_first=norm_first,
                                       device=device)  # fmt: skip
    state = _load(rng, layer)
    x = _x(rng, (2, 6, D))
    causal = np.triu(np.ones((6, 6), bool), 1)  # torch's convention: True = not allowed
    kpm = np.zeros((2, 6), bool)
    kpm[1, 4:] = True
    out = layer(ag.tensor(x.astype(np.float32), device=device), src_mask=ag.tensor(causal, device=device),
                src_key_padding_mask=ag.tensor(kpm, device=device), is_causal=True)  # fmt: skip
    want = ref_encoder_layer(state, x, norm_first, ref_act, mask=causal, kpm=kpm)
    np.testing.assert_allclose(out.to_host(), want, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_reference(device, norm_first) -> None:
    rng = np.random.default_rng(2)
    layer = nn.TransformerDecoderLayer(D, H, FF, batch_first=True, norm_first=norm_first, device=device)
    state = _load(rng, layer)
    tgt, memory = _x(rng, (2, 5, D)), _x(rng, (2, 7, D))
    tgt_mask = np.triu(np.ones((5, 5), bool), 1)
    mem_kpm = np.zeros((2, 7), bool)
    mem_kpm[0, 5:] = True
    out = layer(
        ag.tensor(tgt.astype(np.float32), device=device),
        ag.tensor(memory.astype(np.float32), device=device),
        tgt_mask=ag.tensor(tgt_mask, device=device),
        memory_key_padding_mask=ag.tensor(mem_kpm, device=device),
    )
    want = ref_decoder_layer(state, tgt, memory, norm_first, lambda x: np.maximum(x, 0), tgt_mask, mem_kpm)
    np.testing.assert_allclose(out.to_host(), want, atol=TOL, rtol=TOL)


def test_encoder_stack_with_final_norm_sequence_first(device) -> None:
    rng = np.random.default_rng(3)
    layer = nn.TransformerEncoderLayer(D, H, FF, device=device)
    encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D, device=device))
    keys = list(encoder.state_dict())
    assert "layers.0.self_attn.in_proj_weight" in keys and "layers.1.linear2.bias" in keys and "norm.weight" in keys
    state = _load(rng, encoder)
    x = _x(rng, (6, 2, D))  # (S, N, E)
    out = encoder(ag.tensor(x.astype(np.float32), device=device))
    h = np.swapaxes(x, 0, 1)
    for i in range(2):
        h = ref_encoder_layer(state, h, False, lambda t: np.maximum(t, 0), prefix=f"layers.{i}.")
    want = np.swapaxes(_layer_norm(h, state, "norm."), 0, 1)
    np.testing.assert_allclose(out.to_host(), want, atol=TOL, rtol=TOL)


def test_copies_start_equal_and_an_unknown_activation_is_refused(device) -> None:
    layer = nn.TransformerEncoderLayer(D, H, FF, device=device)
    encoder = nn.TransformerEncoder(layer, 2)
    a, b = (encoder.layers[i].self_attn.in_proj_weight.to_host() for i in range(2))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r'activation must be "relu", "gelu" or a callable, got \'swish\''):
        nn.TransformerEncoderLayer(D, H, activation="swish")


def test_full_transformer_equals_its_stacks(device) -> None:
    """nn.Transformer (torch's keys: encoder / decoder stacks with final norms) against the reference layers
    composed, sequence-first; torch's additive causal mask gives the boolean mask's result."""
    rng = np.random.default_rng(4)
    model = nn.Transformer(D, H, 2, 2, FF, device=device)
    keys = list(model.state_dict())
    assert (
        "encoder.layers.1.self_attn.in_proj_weight" in keys and "decoder.layers.0.multihead_attn.out_proj.bias" in keys
    )
    assert "encoder.norm.weight" in keys and "decoder.norm.bias" in keys
    state = _load(rng, model)
    src, tgt = _x(rng, (6, 2, D)), _x(rng, (5, 2, D))  # (S, N, E), (T, N, E)
    causal = np.triu(np.ones((5, 5), bool), 1)
    relu = lambda t: np.maximum(t, 0)  # noqa: E731
    memory = np.swapaxes(src, 0, 1)
    for i in range(2):
        memory = ref_encoder_layer(state, memory, False, relu, prefix=f"encoder.layers.{i}.")
    memory = _layer_norm(memory, state, "encoder.norm.")
    h = np.swapaxes(tgt, 0, 1)
    for i in range(2):
        h = ref_decoder_layer(_sub(state, f"decoder.layers.{i}."), h, memory, False, relu, tgt_mask=causal)
    want = np.swapaxes(_layer_norm(h, state, "decoder.norm."), 0, 1)
    src_n, tgt_n = (ag.tensor(a.astype(np.float32), device=device) for a in (src, tgt))
    out = model(src_n, tgt_n, tgt_mask=ag.tensor(causal, device=device))
    np.testing.assert_allclose(out.to_host(), want, atol=TOL, rtol=TOL)
    additive = nn.Transformer.generate_square_subsequent_mask(5, device=device)
    np.testing.assert_array_equal(additive.to_host(), np.where(causal, -np.inf, 0.0).astype(np.float32))
    np.testing.assert_allclose(model(src_n, tgt_n, tgt_mask=additive).to_host(), want, atol=TOL, rtol=TOL)
    with pytest.raises(ShapeError, match="Transformer: src and tgt must have the same batch size"):
        model(src_n, ag.tensor(np.zeros((5, 3, D), np.float32), device=device))
    with pytest.raises(ValueError, match="TransformerDecoder: num_layers must be a positive int, got 0"):
        nn.TransformerDecoder(nn.TransformerDecoderLayer(D, H, FF), 0)
