"""Services forked from a process that has already imported what they all import.

Every Kairos service spends most of its start importing the same libraries (FastAPI,
SQLAlchemy, aiokafka, pydantic, the event models): about 0.7 s of CPU each, 80-95% of a
restart, and nine times over when the whole stack starts on two cores. The zygote (the
name is Android's) imports them once, then forks each service on request, so a restart
after a kill costs the service's own modules only, and a full start pays the common part
once. gunicorn's ``--preload`` does the same for its workers.

It preloads only modules that every service imports anyway (a test holds it to that):
metric registries and module state then hold exactly what a service started on its own
would hold. It starts no thread before it forks.

Code edited while a stack runs (a developer's ``kairos up``) must not give a restarted
service the old preloaded modules beside new ones it imports itself: the zygote keeps the
modification times of the project's files it preloaded, and answers a spawn with
``stale`` once one changed; the stack then starts a new zygote, which preloads what is
on disk now.

Protocol, one JSON object a line: the stack writes ``{"spawn": id, "module": m, "env":
{...}, "log": path}`` on the zygote's stdin; the zygote answers ``{"spawned": id, "pid":
p}`` (or ``"error"``, or ``"stale"``) and, whenever a child exits, ``{"exit": pid,
"code": c}`` (negative for a signal, as ``Popen.returncode``). The zygote is the children's parent and reaps
them; EOF on its stdin (the stack is gone) ends it, and leaves its children running, as
a stack's own children are left. ``ForkedProcess`` is the stack's handle on a child, with
the part of ``subprocess.Popen`` the stack uses.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from kairos.embedded import pid_dead

# what every service imports (and imports little else): tests/kairos/test_zygote.py
PRELOAD = ("shared.service", "shared.http", "shared.db", "shared.jobspec", "shared.job_array")


# --- the zygote process ---------------------------------------------------------------------

def _child(req: dict[str, Any], close: list[int]) -> None:
    """In the fork: become the service (never returns)."""
    code = 1
    try:
        os.setpgid(0, 0)  # a group of its own: a Ctrl-C reaches the stack alone
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        # ps shows the service, not the zygote; before the environment is replaced:
        # setproctitle takes its room from the process's first environment
        with contextlib.suppress(ImportError):
            from setproctitle import setproctitle

            setproctitle(f"kairos {req['env'].get('KAIROS_SERVICE_NAME', '')} "
                         f"(python -m {req['module']})")
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = [req["module"]]
        code = 0
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # whatever ends the service is its exit
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # what a normal interpreter exit runs
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _project_files() -> dict[str, float]:
    """The preloaded modules of this project (not the libraries): file -> mtime."""
    root = str(Path(__file__).resolve().parent.parent)
    files = {}
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if path and path.startswith(root) and "site-packages" not in path:
            with contextlib.suppress(OSError):
                files[path] = os.stat(path).st_mtime
    return files


def _changed(files: dict[str, float]) -> bool:
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime != mtime:
                return True
        except OSError:
            return True
    return False


def serve() -> None:
    for module in PRELOAD:
        importlib.import_module(module)
    preloaded = _project_files()
    if threading.active_count() > 1:  # a fork would copy a lock some thread holds
        raise SystemExit("zygote: a preloaded module started a thread; cannot fork safely")
    out = sys.stdout.fileno()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    pending = b""

    def say(msg: dict[str, Any]) -> None:
        os.write(out, (json.dumps(msg) + "\n").encode())

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})  # as Popen's

    while True:
        for key, _ in sel.select():
            if key.fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                continue
            data = os.read(0, 1 << 16)
            if not data:  # the stack is gone
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                req = json.loads(line)
                if _changed(preloaded):  # the stack starts a zygote of the new code
                    say({"spawned": req["spawn"], "stale": True})
                    continue
                try:
                    pid = os.fork()
                except OSError as exc:
                    say({"spawned": req["spawn"], "error": str(exc)})
                    continue
                if pid == 0:
                    _child(req, [sel.fileno(), wake_r, wake_w])  # fd 1 is replaced
                with contextlib.suppress(OSError):  # here too: the group is there on return
                    os.setpgid(pid, pid)
                say({"spawned": req["spawn"], "pid": pid})
        reap()


# --- the stack's side -----------------------------------------------------------------------

class ZygoteGone(RuntimeError):
    pass


class ZygoteStale(ZygoteGone):
    """The project's code changed since the zygote preloaded it."""


class Zygote:
    """The stack's handle on its zygote: spawns services, learns their exits."""

    def __init__(self, log: Path) -> None:
        with open(log, "ab") as err:
            self._proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "kairos.zygote"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, process_group=0)
        self._lock = threading.Condition()
        self._spawned: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self._ids = 0
        self._reader = threading.Thread(target=self._read, name="zygote", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            msg = json.loads(line)
            with self._lock:
                if "spawned" in msg:
                    self._spawned[msg["spawned"]] = msg
                else:
                    self._exits[msg["exit"]] = msg["code"]
                self._lock.notify_all()
        with self._lock:  # gone: nobody will say more
            self._lock.notify_all()

    def spawn(self, module: str, env: dict[str, str], log: Path,
              timeout_s: float = 30.0) -> ForkedProcess:
        with self._lock:
            self._ids += 1
            ident = self._ids
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps({"spawn": ident, "module": module, "env": env,
                                                "log": str(log)}) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise ZygoteGone("the zygote is gone") from exc
        with self._lock:
            if not self._lock.wait_for(lambda: ident in self._spawned or not self.alive,
                                       timeout_s):
                raise ZygoteGone(f"no answer from the zygote in {timeout_s:g}s")
            msg = self._spawned.pop(ident, None)
        if msg is not None and msg.get("stale"):
            raise ZygoteStale("the code changed since the zygote started")
        if msg is None or "error" in msg:
            raise ZygoteGone(f"the zygote could not fork: {msg and msg.get('error')}")
        return ForkedProcess(int(msg["pid"]), self)

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout_s: float | None) -> int | None:
        with self._lock:
            self._lock.wait_for(lambda: pid in self._exits or not self.alive, timeout_s)
            return self._exits.get(pid)

    def close(self) -> None:
        """Its children are stopped already: EOF ends it."""
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class ForkedProcess:
    """A service forked by the zygote: the part of ``Popen`` the stack uses."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._zygote = zygote

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid)
            if self.returncode is None and not self._zygote.alive and pid_dead(self.pid):
                self.returncode = 255  # ended after its zygote: its status is unknown
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            if self._zygote.alive:
                self._zygote.wait_exit(self.pid, None if left is None else min(left, 0.5))
            else:
                time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve()
