from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def slice_file(tmp_path: Path):
    """Write the first ``n`` data lines of a trace (with its header) to a temp file."""

    def make(src: Path, n: int, name: str | None = None) -> Path:
        lines = src.read_text().splitlines()[: n + 1]
        out = tmp_path / (name or src.name)
        out.write_text("\n".join(lines) + "\n")
        return out

    return make
