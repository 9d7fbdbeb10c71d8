"""netcl.nn.KVCache and netcl.nn.generation with the small GPT of examples/gpt.py.

The reference is a float64 NumPy transcription of the GPT (embeddings, pre-norm blocks with causal
softmax attention and a tanh-GELU MLP, final LayerNorm, LM head) run over the whole sequence; the
decoded logits at position p must equal its row p. The float32 model sums a few hundred O(1)
products per output in float32, so logits agree to ~1e-6; 2e-5 abs / 1e-4 rel leaves ~10x room.
Replayed decoding runs the very kernels of eager decoding on the same buffers, so its greedy tokens
must be identical and its logits equal to float rounding.
"""

from __future__ import annotations

import file_modules
import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn as nn
from netcl.core.device_errors import ERROR_WORDS
from netcl.nn.generation import Decoder, generate, sample

ATOL, RTOL = 2e-5, 1e-4
gpt_example = file_modules.load("examples/gpt.py", "netcl_example_gpt")

VOCAB, MAX_LEN, D, HEADS, LAYERS = 40, 24, 32, 4, 2


@pytest.fixture
def model(device):
    ag.manual_seed(7)
    m = gpt_example.GPT(VOCAB, MAX_LEN, d_model=D, n_head=HEADS, n_layer=LAYERS, device=device)
    m.eval()
    return m


# ---- float64 reference ---------------------------------------------------------------------
def _ln(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def reference_logits(model, ids):
    """(B, S, vocab) logits of the GPT in float64 over the full sequence ``ids`` (B, S)."""
    p = {k: np.asarray(v.to_host() if hasattr(v, "to_host") else v, np.float64) for k, v in model.state_dict().items()}
    B, S = ids.shape
    E = D // HEADS
    x = p["tok_emb.weight"][ids] + p["pos_emb.weight"][:S]
    causal = np.tril(np.ones((S, S), bool))
    for i in range(LAYERS):
        pre = f"blocks.{i}."
        h = _ln(x, p[pre + "ln1.weight"], p[pre + "ln1.bias"])
        qkv = h @ p[pre + "attn.qkv.weight"].T + p[pre + "attn.qkv.bias"]
        q, k, v = (t.reshape(B, S, HEADS, E).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, axis=-1))
        s = np.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(E), -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        y = (a @ v).transpose(0, 2, 1, 3).reshape(B, S, D)
        x = x + y @ p[pre + "attn.proj.weight"].T + p[pre + "attn.proj.bias"]
        h = _ln(x, p[pre + "ln2.weight"], p[pre + "ln2.bias"])
        h = _gelu(h @ p[pre + "fc.weight"].T + p[pre + "fc.bias"])
        x = x + h @ p[pre + "out.weight"].T + p[pre + "out.bias"]
    return _ln(x, p["ln_f.weight"], p["ln_f.bias"]) @ p["head.weight"].T


# ---- tests -----------------------------------------------------------------------------------
@pytest.mark.parametrize("replay", [False, True])
def test_decoded_logits_equal_the_float64_full_sequence(model, device, replay):
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 12))
    expected = reference_logits(model, ids)
    decoder = Decoder(model, batch=2, replay=replay)
    for pos in range(ids.shape[1]):
        logits = decoder.step(ids[:, pos], pos)
        np.testing.assert_allclose(logits, expected[:, pos], atol=ATOL, rtol=RTOL, err_msg=f"pos {pos}")
    assert decoder.captures == (1 if replay else 0)


def test_full_forward_matches_the_reference(model, device):
    ids = np.random.default_rng(2).integers(0, VOCAB, (2, 9)).astype(np.int32)
    with ag.no_grad():
        logits = model(ag.tensor(ids, device=device, dtype=np.int32)).to_host()
    np.testing.assert_allclose(logits, reference_logits(model, ids), atol=ATOL, rtol=RTOL)


def test_replayed_greedy_decoding_gives_the_eager_tokens(model, device):
    prompt = np.array([[1, 2, 3], [7, 7, 0]])
    eager = generate(model, prompt, 12, temperature=0, replay=False)
    replayed = Decoder(model, batch=2, replay=True)
    tokens = replayed.generate(prompt, 12, temperature=0)
    np.testing.assert_array_equal(tokens, eager)
    np.testing.assert_array_equal(tokens[:, :3], prompt)
    # the tokens are the argmax of the float64 model at every step
    expected = reference_logits(model, tokens[:, :-1]).argmax(-1)[:, 2:]
    np.testing.assert_array_equal(tokens[:, 3:], expected)


def test_one_capture_replays_every_position(model, device):
    decoder = Decoder(model, batch=1, replay=True)
    decoder.generate(np.array([[4, 5]]), 10, temperature=0)
    graph = decoder.graph
    launches = len(graph.launches)
    assert decoder.captures == 1 and graph.replays == 10  # positions 0..10 (the last token is never fed)
    assert graph.variables == {"pos": decoder.pos}
    decoder.generate(np.array([[9]]), 5, temperature=0)  # a new sequence reuses the capture from position 0
    assert decoder.captures == 1 and decoder.graph is graph and graph.replays == 15
    assert len(graph.launches) == launches


@pytest.mark.parametrize("replay", [False, True])
def test_greedy_decoding_reads_back_once(model, cl_device, host_reads, replay):
    """Each step's argmax stays on the device as the next step's input: a greedy ``generate`` reads
    only its tokens (``next_ids``, one (batch, max_len) int32 copy) and, at that wait, the device's
    error word (the embedding's index check), never a step's logits."""
    m = gpt_example.GPT(VOCAB, MAX_LEN, d_model=D, n_head=HEADS, n_layer=LAYERS, device=cl_device)
    m.load_state_dict(model.state_dict())
    m.eval()
    decoder = Decoder(m, batch=2, replay=replay)
    prompt = np.array([[1, 2, 3], [7, 7, 0]])
    decoder.generate(prompt, 4, temperature=0)  # builds the programs (and captures)
    with host_reads() as reads:
        tokens = decoder.generate(prompt, 9, temperature=0)
    assert sorted(reads) == sorted([2 * MAX_LEN * 4, ERROR_WORDS * 4])
    host_greedy = [prompt[:, i] for i in range(3)]
    stepper = Decoder(m, batch=2, replay=False)
    for pos in range(11):
        logits = stepper.step(host_greedy[pos], pos)
        if pos >= 2:
            host_greedy.append(sample(logits, 0, None, None))
    np.testing.assert_array_equal(tokens, np.stack(host_greedy, axis=1))


def test_sampling_is_seeded_and_top_k_1_is_greedy(model, device):
    prompt = np.array([[3, 1]])
    a = generate(model, prompt, 8, temperature=1.0, top_k=5, seed=11)
    b = generate(model, prompt, 8, temperature=1.0, top_k=5, seed=11)
    np.testing.assert_array_equal(a, b)
    greedy = generate(model, prompt, 8, temperature=0)
    np.testing.assert_array_equal(generate(model, prompt, 8, temperature=2.0, top_k=1, seed=3), greedy)
    assert ((a >= 0) & (a < VOCAB)).all()


def test_sample_rule():
    rng = np.random.default_rng(0)
    logits = np.array([[0.0, 5.0, 1.0, 4.9], [3.0, 3.0, -1.0, 0.0]])
    np.testing.assert_array_equal(sample(logits, 0, None, rng), [1, 0])  # ties go to the lowest id
    draws = np.array([sample(logits[:1], 1.0, 2, rng)[0] for _ in range(200)])
    assert set(draws) == {1, 3}  # only the two largest remain


def test_bound_length_beyond_the_maximum_raises_before_any_launch(model, device):
    decoder = Decoder(model, batch=1, replay=True)
    with pytest.raises(
        ValueError, match=r"max_new_tokens=20 with a prompt of 5 tokens needs 25 positions; .*max_len is 24"
    ):
        decoder.generate(np.arange(5)[None], 20)
    with pytest.raises(ValueError, match=r"max_new_tokens=21 .* needs 25 positions"):
        generate(model, np.arange(4), 21)
    with pytest.raises(ValueError, match=r"Variable 'pos': value 24 is outside \[0, 23\]"):
        decoder.step(np.array([1]), MAX_LEN)
    with pytest.raises(ValueError, match="prompt_ids must be a non-empty"):
        generate(model, np.zeros((1, 0), np.int64), 3)
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        decoder.generate(np.array([[1]]), 2, temperature=-1)
    assert decoder.captures == 0 and decoder.graph is None


def test_kv_cache_shapes_and_errors(device):
    cache = nn.KVCache(2, 3, 10, 4, value_dim=5, device=device)
    assert cache.k.shape == (2, 3, 10, 4) and cache.v.shape == (2, 3, 10, 5)
    with pytest.raises(ValueError, match="KVCache: max_len must be a positive int"):
        nn.KVCache(1, 1, 0, 4, device=device)
    q = ag.tensor(np.zeros((2, 3, 1, 4), np.float32), device=device)
    with pytest.raises(ValueError, match=r"cache_attention: pos=10 plus the 1 row"):
        cache.attend(q, 10)
