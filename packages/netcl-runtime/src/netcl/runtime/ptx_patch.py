"""Instructions NVIDIA's OpenCL compiler refuses, reached by patching the PTX it produces.

The driver compiles OpenCL C to PTX for plain ``sm_90`` and its ptxas refuses Hopper's
architecture-specific instructions there (``wgmma``: "not supported on .target 'sm_90'"). A kernel
spells each such instruction as an inline-asm *comment*, ``asm volatile("// NETCL_PTX wgmma...")``,
so the front end substitutes its operands and passes it through; ``patch`` then turns those comments
into instructions and sets the target to ``sm_90a``, and the program cache rebuilds the program from
the patched PTX (``clCreateProgramWithBinary`` takes PTX on NVIDIA). A device whose driver refuses
the patched PTX fails that build with a ``CompileError``, which the kernel's probe turns into "not
available". PTX that uses instructions of a later PTX version than the compiler wrote (``tensormap.replace``
and its proxy fence: 8.3) gets that version.
"""

from __future__ import annotations

import re

#: The prefix of an inline-asm comment that ``patch`` turns into the instruction after it.
MARK = "// NETCL_PTX "
_TARGET = re.compile(r"^(\s*\.target\s+)sm_90\b(?!a)", re.MULTILINE)
_VERSION = re.compile(r"^(\s*\.version\s+)(\d+)\.(\d+)", re.MULTILINE)
#: the PTX version the marked instructions containing a word need
_NEEDS = {"tensormap": (8, 3)}


def needed(source: str) -> bool:
    """Whether an OpenCL C ``source`` spells instructions for ``patch``."""
    return MARK in source


def patch(ptx: str) -> str:
    """``ptx`` with every ``MARK`` comment made an instruction and the target ``sm_90a``.

    Raises ``ValueError`` when the PTX targets something other than ``sm_90`` (the instructions
    exist only on Hopper) or holds no marked instruction (the compiler dropped them).
    """
    if not _TARGET.search(ptx):
        found = re.search(r"\.target\s+([^\s,]+)", ptx)
        raise ValueError(f"PTX patch: target {found.group(1) if found else '(none)'}; sm_90 expected")
    if MARK not in ptx:
        raise ValueError("PTX patch: the compiled PTX holds no marked instruction")
    patched = _TARGET.sub(r"\1sm_90a", ptx).replace(MARK, "")
    wanted = max((v for word, v in _NEEDS.items() if word in patched), default=None)
    found = _VERSION.search(patched)
    if wanted and found and (int(found.group(2)), int(found.group(3))) < wanted:
        patched = _VERSION.sub(rf"\g<1>{wanted[0]}.{wanted[1]}", patched, count=1)
    return patched
