"""A file replaced whole or not at all: written beside itself, then renamed over it, so
a kill -9 leaves the old content or the new, never a torn file (which would read as no
record at all). Its folder is made on the first write that finds it missing, not
checked on every write: an agent writes a few of these per task.

Importable on Python 3.9, as the local-process runtime that uses it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(text)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, value: Any) -> None:
    write_text(path, json.dumps(value))
