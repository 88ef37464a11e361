"""What the node's local dataset cache holds, for the scheduler's locality preference.

A dataset is an entry (directory or file) of the cache directory (``KAIROS_DATASETS_DIR``),
named as jobs name it in their spec's ``dataset``. A configured list (``KAIROS_DATASETS``)
adds names: simulated nodes have no cache directory. Hidden entries and partial downloads
(``*.tmp``, ``*.partial``, ...) do not count. The listing is read at registration and with every heartbeat, so a dataset that
lands in the cache is preferred from the next heartbeat on.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

PARTIAL = (".tmp", ".partial", ".part", ".download")


class DatasetCache:
    def __init__(self, directory: str = "", configured: Iterable[str] = ()) -> None:
        self.directory = directory
        self.configured = sorted({d.strip() for d in configured if d.strip()})

    @classmethod
    def from_setting(cls, directory: str, names: str) -> DatasetCache:
        """``names`` is a comma-separated list (``KAIROS_DATASETS``)."""
        return cls(directory, names.split(","))

    def list(self) -> list[str]:
        found = set(self.configured)
        if self.directory:
            try:
                with os.scandir(self.directory) as entries:
                    found.update(e.name for e in entries if not e.name.startswith(".")
                                 and not e.name.endswith(PARTIAL))
            except OSError:
                pass  # no cache directory (yet): nothing cached
        return sorted(found)
