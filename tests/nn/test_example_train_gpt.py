"""examples/train_gpt.py runs a few steps, reports validation loss and perplexity, writes a loadable
safetensors checkpoint and samples with the key/value cache (replayed and eager give the same greedy text)."""

from __future__ import annotations

import json
import math
import re
import runpy
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import netcl.nn as nn

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
TINY = ["--d-model", "32", "--n-head", "2", "--n-layer", "1", "--block-size", "32", "--batch-size", "4"]


def run(monkeypatch, capsys, *args: str) -> tuple[dict, str]:
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), *args])
    namespace = runpy.run_path(str(EXAMPLE), run_name="train_gpt_test")
    result = namespace["train"](namespace["parse_args"](list(args)))
    return result, capsys.readouterr().out


def test_tiny_run_writes_a_checkpoint_and_samples(device, monkeypatch, capsys, tmp_path):
    ckpt = tmp_path / "gpt.safetensors"
    args = [*TINY, "--device", device.spec, "--max-steps", "3", "--steps-per-epoch", "2", "--epochs", "3"]
    args += ["--val-batches", "2", "--checkpoint", str(ckpt), "--quiet", "--sample", "def ", "--sample-tokens", "12"]
    result, out = run(monkeypatch, capsys, *args)
    epochs = re.findall(r"epoch (\d+): train loss ([0-9.]+)  val loss ([0-9.]+)  val perplexity ([0-9.]+)", out)
    assert [e[0] for e in epochs] == ["1", "2"]  # 3 steps at 2 per epoch
    for _, _, val, ppl in epochs:
        assert float(ppl) == pytest.approx(math.exp(float(val)), rel=1e-3)
        assert float(val) < math.log(98) + 0.5  # near or below uniform over the 98 tokens
    assert result["steps"] == 3 and ckpt.exists()
    with safe_open(str(ckpt), "np") as f:
        config = json.loads(f.metadata()["config"])
    assert config == {"vocab_size": 98, "max_len": 32, "d_model": 32, "n_head": 2, "n_layer": 1}
    state = nn.load(str(ckpt))
    assert state["tok_emb.weight"].shape == (98, 32) and "blocks.0.attn.qkv.weight" in state
    assert "sample (12 tokens, replayed decode" in out
    assert result["sample"].startswith("def ") and len(result["sample"]) == 4 + 12


def test_loaded_checkpoint_samples_the_same_greedy_text_replayed_and_eager(cl_device, monkeypatch, capsys, tmp_path):
    ckpt = tmp_path / "gpt.safetensors"
    run(monkeypatch, capsys, *TINY, "--device", "cpu", "--max-steps", "2", "--val-batches", "1", "--quiet",
        "--checkpoint", str(ckpt))  # fmt: skip
    sample = [
        "--load",
        str(ckpt),
        "--max-steps",
        "0",
        "--sample",
        "import ",
        "--sample-tokens",
        "20",
        "--temperature",
        "0",
    ]
    sample += ["--quiet"]
    replayed, _ = run(monkeypatch, capsys, *sample, "--device", cl_device.spec)
    eager, _ = run(monkeypatch, capsys, *sample, "--device", cl_device.spec, "--eager-sample")
    numpy_backend, _ = run(monkeypatch, capsys, *sample, "--device", "cpu")
    assert replayed["sample"] == eager["sample"] == numpy_backend["sample"]
    assert replayed["checkpoint"] is None  # no steps, nothing saved


def test_split_is_fixed_by_file_and_the_vocabulary_round_trips(monkeypatch, capsys):
    namespace = runpy.run_path(str(EXAMPLE), run_name="train_gpt_test")
    files = namespace["stdlib_files"]()
    val_files = [p for p in files if zlib.crc32(p.name.encode()) % 10 == 0]
    assert 0 < len(val_files) < len(files)
    train, val, n_train, n_val = namespace["load_corpus"]()
    assert (n_train, n_val) == (len(files) - len(val_files), len(val_files))
    assert train.max() < 98 and val.min() >= 0
    text = "def f(x):\n\treturn x  # ok"
    assert namespace["decode"](namespace["encode"](text)) == text
    assert namespace["decode"](namespace["encode"]("é")) == "\ufffd\ufffd"  # two UTF-8 bytes, unknown
    assert np.asarray(namespace["encode"]("é")).tolist() == [97, 97]


def test_a_sample_longer_than_the_context_is_refused_before_training(monkeypatch, capsys):
    with pytest.raises(SystemExit, match=r"--sample-tokens 40 with a 4-character prompt needs 44 positions"):
        run(monkeypatch, capsys, *TINY, "--device", "cpu", "--sample", "def ", "--sample-tokens", "40")
    assert "GPT of" not in capsys.readouterr().out


def test_windows_gather_batch_equals_the_items_collated():
    from netcl.data import default_collate

    namespace = runpy.run_path(str(EXAMPLE), run_name="train_gpt_test")
    data = namespace["encode"]("import sys\nprint(sys.argv)\n" * 3)
    windows = namespace["Windows"](data, np.array([0, 5, 17, 30, 2]), 8)
    indices = [4, 1, 1, 3]
    gathered = windows.gather_batch(indices, lambda shape, dtype: np.full(shape, -1, dtype))
    reference = default_collate([windows[i] for i in indices])
    for got, want in zip(gathered, reference, strict=True):
        assert got.dtype == want.dtype == np.int32
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(gathered[1][:, :-1], gathered[0][:, 1:])  # targets: the inputs shifted by one
