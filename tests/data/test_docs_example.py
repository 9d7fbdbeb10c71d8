"""docs/data.md's example runs as written (on the default device)."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def test_data_page_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(PAGE), "exec"), {"__name__": "docs_example"})
    assert "5 batches per epoch; last loss" in capsys.readouterr().out
