"""The GEMM kernels share one signature and one block indexing (``gemm_source.kernel_signature`` /
``block_indexing``), and the tensor-core sources did not change when they began to share them.

The tensor-core kernels build only on NVIDIA GPUs, so their sources are pinned instead: the SHA-256 of
``mma_source`` for a few configs (mma.sync, cp.async stages, fragment prefetch, wgmma, swap), captured
from the code before the block indexing was shared. A deliberate change to the tensor-core kernel
updates these digests.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from netcl.runtime.ops.gemm_mma_source import MmaConfig, mma_source
from netcl.runtime.ops.gemm_source import (
    IDENTITY,
    PLUS_ADDEND,
    Epilogue,
    GemmConfig,
    block_indexing,
    kernel_signature,
    portable_source,
)

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
EPILOGUES = {"IDENTITY": IDENTITY, "PLUS_ADDEND": PLUS_ADDEND, 'Epilogue(bias="row")': Epilogue(bias="row"),
             'Epilogue(bias="col")': Epilogue(bias="col")}  # fmt: skip

#: (config, mode, trans_a, trans_b, dtypes, index type, epilogue, sha256 of the source before the refactor)
PINNED = [
    (
        "MmaConfig()",
        "tf32",
        False,
        False,
        "f32",
        "int",
        "IDENTITY",
        "bc4e2508fd2b5092f566ddc866fe4092595f66f29ee603f3ed5f06d977d32cd0",
    ),
    (
        "MmaConfig(stages=3, group=8)",
        "f16",
        False,
        True,
        "f16",
        "long",
        "PLUS_ADDEND",
        "f147b6c973f4df6a130e132ca9d18b0951ea7767c73849dcb9e09befc2efd755",
    ),
    (
        "MmaConfig(fpre=1, ldsm=0, va=0, vb=0)",
        "bf16",
        True,
        False,
        "f32",
        "int",
        'Epilogue(bias="row")',
        "bd3979a5668a708e3f8a40f685aa4c4be8d021966b52d2650a2817474daffc3a",
    ),
    (
        "MmaConfig(stages=2, fn=4)",
        "tf32x3",
        True,
        True,
        "f32",
        "int",
        "IDENTITY",
        "fdde41f72846ce66ff99284d87074eaf4421a3f99e33b630dbe08f17fd0c8eaf",
    ),
    (
        "MmaConfig(4, 1, 2, 16, 16, stages=3, wg=2)",
        "f16",
        False,
        False,
        "f16",
        "int",
        'Epilogue(bias="col")',
        "bad60e1376b9eaca101a196fe7cf3d222d8cc9483fbeec3c37bc0c39afb8ff3a",
    ),
    (
        "MmaConfig(8, 1, 1, 32, 8, stages=4, wg=1)",
        "tf32",
        False,
        True,
        "f32",
        "long",
        "IDENTITY",
        "a3e837793ad1d6b7122fb454f947ba2f5e76ad6e098dccb5418274714ee1c211",
    ),
    (
        "MmaConfig(4, 1, 1, 2, 8, stages=3, wg=2, swap=1)",
        "tf32",
        False,
        False,
        "f32",
        "int",
        "PLUS_ADDEND",
        "5b06f8254b72cdaba2c36a68fe091ad8dde6cfd5cfec9ae81208d185ef2d6341",
    ),
]


def _config(text: str) -> MmaConfig:
    return eval(text, {"MmaConfig": MmaConfig})  # the literals above


@pytest.mark.parametrize("case", PINNED, ids=[f"{c[0]}-{c[1]}" for c in PINNED])
def test_mma_sources_unchanged(case):
    cfg_text, mode, trans_a, trans_b, dt, idx, epilogue, digest = case
    cfg = _config(cfg_text)
    assert not cfg.problems(mode, trans_a, trans_b)
    dtype = F16 if dt == "f16" else F32
    source = mma_source(cfg, mode, trans_a, trans_b, dtype, dtype, dtype, idx, EPILOGUES[epilogue])
    assert hashlib.sha256(source.encode()).hexdigest() == digest


@pytest.mark.parametrize("sc", ["float", "half"])
def test_both_kernels_share_the_block_indexing(sc):
    dtype = F16 if sc == "half" else F32
    mma = mma_source(MmaConfig(), "f16", False, False, dtype, dtype, dtype)
    portable = portable_source(GemmConfig(), False, False, dtype, dtype, dtype)
    bias = Epilogue(bias="row")
    for source, st in ((mma, "ushort" if sc == "half" else "float"), (portable, sc)):
        assert block_indexing(sc) in source
        assert kernel_signature(st, st, sc, "") in source
        assert source.count("get_group_id(2)") == 1  # the batch and split come from the shared lines only
    with_bias = portable_source(GemmConfig(), False, False, dtype, dtype, dtype, epilogue=bias)
    assert kernel_signature(sc, sc, sc, bias.params()) in with_bias
    assert f"__global {sc}* Cz = C + zb * csb + s * css;" in block_indexing(sc)
