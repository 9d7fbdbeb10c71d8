"""docs/generation.md's example runs as written (on the default device)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "generation.md"


def test_generation_page_example_runs(capsys, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(ROOT)  # the example imports examples/gpt.py by a relative path
    monkeypatch.setattr(sys, "path", list(sys.path))  # the example's sys.path.insert is undone
    exec(compile(blocks[0], str(PAGE), "exec"), {"__name__": "docs_example"})
    assert "(1, 13) (1, 13)" in capsys.readouterr().out
