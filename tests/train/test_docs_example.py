"""docs/training.md's example runs as written (on the default device)."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def test_training_page_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(PAGE), "exec"), {"__name__": "docs_example"})
    out = capsys.readouterr().out
    assert "12 steps; val acc per epoch" in out
    assert "resumed at epoch 2: 12 more steps; final val acc" in out
