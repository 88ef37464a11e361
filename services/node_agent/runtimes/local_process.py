"""Local process runtime: a task is a process group on this host.

Each task gets a directory under ``<state_dir>/tasks/`` holding ``state.json`` (key, pid,
process start time, log path; written before ``start()`` returns) and ``exit`` (the exit
code, written by a tiny ``/bin/sh`` wrapper around the command). Because the output goes
straight to a log file and the exit code to a file, a task survives an agent restart:
``reconcile()`` adopts the tasks still alive (pid *and* start time match, so a reused
pid is not mistaken for the task) and returns those that ended while the agent was down.

An ended task keeps a tombstone (its ``state.json`` marked ``reported``) so that a
redelivered binding for the same attempt starts nothing: ``start()`` reports the
recorded exit again instead. Tombstones older than ``keep_done_s`` are pruned.

Stop: SIGTERM to the process group (the checkpoint signal), up to ``grace_s`` to exit,
then SIGKILL. When a task ends, whatever is left of its process group is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from services.node_agent.atomic_file import write_json
from services.node_agent.isolation.mps import MpsDaemon, is_share, merge_env, share_env
from services.node_agent.runtimes import procfs
from services.node_agent.runtimes.base import (
    CHECKPOINT_ENV,
    ExitCallback,
    RuntimeStartError,
    TaskExit,
    TaskLaunch,
    exit_reason,
    read_checkpoint,
)

log = logging.getLogger(__name__)

# The shell stays the group leader and waits for the command in the foreground; a trap
# (not an ignore, which the command would inherit) lets it outlive SIGTERM long enough
# to record the command's exit code.
WRAPPER = (
    'trap : TERM INT; "$@"; code=$?; '
    'printf "%s\\n" "$code" > "$KAIROS_EXIT_FILE.tmp" && '
    'mv "$KAIROS_EXIT_FILE.tmp" "$KAIROS_EXIT_FILE"; exit "$code"'
)
PASSTHROUGH_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH")


class LocalProcessRuntime:
    name = "local"

    def __init__(
        self,
        on_exit: ExitCallback,
        state_dir: str | os.PathLike[str],
        *,
        mps: MpsDaemon | None = None,
        device_memory_mib: Mapping[int, int] | None = None,
        base_env: Mapping[str, str] | None = None,
        poll_s: float = 1.0,
        keep_done_s: float = 7 * 86400,
    ) -> None:
        self._on_exit = on_exit
        self._dir = Path(state_dir)
        (self._dir / "tasks").mkdir(parents=True, exist_ok=True)
        self._mps = mps
        self._device_memory = dict(device_memory_mib or {})
        self._base_env = dict(base_env) if base_env is not None else {
            k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        self._poll_s = poll_s
        self._keep_done_s = keep_done_s
        self._pids: dict[str, int] = {}  # live tasks: key -> pid (= process group id)
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._stopping: dict[str, tuple[str, str]] = {}  # key -> (reason, message)

    # --- files ------------------------------------------------------------------------

    def _task_dir(self, key: str) -> Path:
        return self._dir / "tasks" / quote(key, safe="")

    def log_path(self, key: str) -> Path:
        return self._task_dir(key) / "output.log"

    @staticmethod
    def _read_state_dir(task_dir: Path) -> dict[str, Any] | None:
        try:
            return json.loads((task_dir / "state.json").read_text())
        except (OSError, ValueError):
            return None

    def _read_state(self, key: str) -> dict[str, Any] | None:
        return self._read_state_dir(self._task_dir(key))

    def _write_state(self, key: str, state: dict[str, Any]) -> None:
        write_json(self._task_dir(key) / "state.json", state)

    def _work(self, key: str) -> tuple[float | None, str | None]:
        """The work done: seconds from the start to the exit file (written when the task
        ended; now if it has none), and the checkpoint the task recorded, if any."""
        task_dir = self._task_dir(key)
        state = self._read_state(key) or {}
        try:
            ended = (task_dir / "exit").stat().st_mtime
        except OSError:
            ended = time.time()
        started = state.get("started_at")
        ran_s = round(max(0.0, ended - started), 3) if started else None
        try:
            checkpoint = read_checkpoint((task_dir / "checkpoint").read_text(errors="replace"))
        except OSError:
            checkpoint = None
        return ran_s, checkpoint

    def _recorded_exit(self, key: str, message: str = "") -> TaskExit:
        ran_s, checkpoint = self._work(key)
        try:
            code = int((self._task_dir(key) / "exit").read_text().strip())
        except (OSError, ValueError):
            return TaskExit(key, 128 + signal.SIGKILL, "killed",
                            message or "killed before it could record an exit code",
                            ran_s, checkpoint)
        return TaskExit(key, code, exit_reason(code), message, ran_s, checkpoint)

    # --- start ------------------------------------------------------------------------

    async def _env(self, launch: TaskLaunch) -> dict[str, str]:
        grants = launch.gpus
        platform: dict[str, str] = {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            # a MIG instance only by its UUID: an index would expose the whole GPU
            "CUDA_VISIBLE_DEVICES": ",".join(
                g.uuid if g.is_mig or all(x.uuid for x in grants) else str(g.index)
                for g in grants),
            "KAIROS_JOB_ID": launch.job_id,
            "KAIROS_TASK_ID": launch.task_id,
            "KAIROS_ATTEMPT": str(launch.attempt),
        }
        platform.update(share_env(grants, self._device_memory))
        if is_share(grants) and self._mps is not None and await self._mps.ensure_started():
            platform.update(self._mps.client_env())
        env = merge_env(self._base_env, launch.env, platform)
        env["KAIROS_EXIT_FILE"] = str(self._task_dir(launch.key) / "exit")
        env[CHECKPOINT_ENV] = str(self._task_dir(launch.key) / "checkpoint")
        return env

    async def start(self, launch: TaskLaunch) -> None:
        key = launch.key
        if key in self._pids:
            return
        state = self._read_state(key)
        if state is not None:  # known from an earlier run of the agent, or already ended
            if procfs.alive(state["pid"], state.get("ticks")):
                self._adopt(key, state)
            else:
                await self._report(self._recorded_exit(key))
            return
        if not launch.command:
            raise RuntimeStartError(f"{key}: no command to run")
        env = await self._env(launch)
        if shutil.which(launch.command[0], path=env.get("PATH")) is None:
            raise RuntimeStartError(f"{key}: command not found: {launch.command[0]}")
        task_dir = self._task_dir(key)
        task_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("exit", "checkpoint"):
            with contextlib.suppress(FileNotFoundError):
                (task_dir / stale).unlink()
        out = os.open(self.log_path(key), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", WRAPPER, "kairos-task", *launch.command,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
                env=env, cwd=env.get("KAIROS_WORKDIR") or None, start_new_session=True)
        except OSError as exc:
            raise RuntimeStartError(f"{key}: {exc}") from exc
        finally:
            os.close(out)
        self._write_state(key, {"key": key, "pid": proc.pid, "ticks": procfs.start_ticks(proc.pid),
                                "started_at": time.time(), "command": list(launch.command),
                                "reported": False})
        self._pids[key] = proc.pid
        self._watchers[key] = asyncio.create_task(self._wait_child(key, proc))
        log.info("started %s as pid %d", key, proc.pid)

    # --- exits ------------------------------------------------------------------------

    async def _wait_child(self, key: str, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        exit_ = self._recorded_exit(key)
        if rc < 0 and not (self._task_dir(key) / "exit").exists():
            exit_ = replace(exit_, exit_code=128 - rc, reason="killed",
                            message=f"killed by signal {-rc}")
        await self._finish(key, proc.pid, exit_)

    def _adopt(self, key: str, state: dict[str, Any]) -> None:
        self._pids[key] = state["pid"]
        self._watchers[key] = asyncio.create_task(self._poll_adopted(key, state))
        log.info("adopted %s (pid %d) from an earlier agent run", key, state["pid"])

    async def _poll_adopted(self, key: str, state: dict[str, Any]) -> None:
        # not our child (it was the previous agent's): nothing to await but /proc
        while procfs.alive(state["pid"], state.get("ticks")):
            await asyncio.sleep(self._poll_s)
        await self._finish(key, state["pid"], self._recorded_exit(key))

    async def _finish(self, key: str, pgid: int, exit_: TaskExit) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)  # what is left of the task (e.g. data loaders)
        stop = self._stopping.pop(key, None)
        if stop is not None:
            exit_ = replace(exit_, reason=stop[0], message=stop[1])
        self._pids.pop(key, None)
        self._watchers.pop(key, None)
        await self._report(exit_)

    async def _report(self, exit_: TaskExit) -> None:
        try:
            await self._on_exit(exit_)
        except Exception:  # the exit stays unreported: reconcile() returns it again
            log.exception("reporting the exit of %s failed", exit_.key)
            return
        await self.forget(exit_.key)

    async def forget(self, key: str) -> None:
        """The exit of ``key`` was reported: keep only a tombstone."""
        state = self._read_state(key)
        if state is not None and not state.get("reported"):
            state["reported"] = True
            state["ended_at"] = time.time()
            self._write_state(key, state)

    # --- Runtime ----------------------------------------------------------------------

    async def stop(self, key: str, grace_s: float, reason: str = "stopped",
                   message: str = "") -> None:
        pgid, watcher = self._pids.get(key), self._watchers.get(key)
        if pgid is None or watcher is None:
            return
        self._stopping.setdefault(key, (reason, message))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        done, _ = await asyncio.wait({watcher}, timeout=max(grace_s, 0.0))
        if not done:
            log.info("%s did not exit within %.0fs of SIGTERM: SIGKILL", key, grace_s)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            await asyncio.shield(watcher)

    async def running(self) -> list[str]:
        return sorted(self._pids)

    def task_pids(self, key: str) -> set[int]:
        """The task's processes (for the share watchdog); empty when it does not run."""
        pgid = self._pids.get(key)
        return procfs.process_tree(pgid) if pgid is not None else set()

    async def reconcile(self) -> list[TaskExit]:
        """Adopt tasks still alive; return those that ended unreported (call ``forget``
        for each once published). Prunes old tombstones."""
        ended = []
        now = time.time()
        for task_dir in sorted((self._dir / "tasks").iterdir()):
            state = self._read_state_dir(task_dir)
            if state is None or state["key"] in self._pids:
                continue
            key = state["key"]
            if state.get("reported"):
                if now - state.get("ended_at", now) > self._keep_done_s:
                    shutil.rmtree(task_dir, ignore_errors=True)
            elif procfs.alive(state["pid"], state.get("ticks")):
                self._adopt(key, state)
            else:
                ended.append(self._recorded_exit(key, "ended while the agent was down"))
        return ended

    def logs(self, key: str, tail: int | None = None) -> str:
        """The task's output (stdout and stderr), or its last ``tail`` lines."""
        path = self.log_path(key)
        if not path.exists():
            raise KeyError(key)
        with open(path, encoding="utf-8", errors="replace") as f:
            if tail is None:
                return f.read()
            return "".join(deque(f, maxlen=tail))

    async def close(self) -> None:
        """Stop watching; tasks keep running and are adopted by the next agent run."""
        for watcher in self._watchers.values():
            watcher.cancel()
        self._watchers.clear()
        self._pids.clear()
        if self._mps is not None and not any(
                procfs.alive(s["pid"], s.get("ticks")) for s in self._live_states()):
            await self._mps.stop()

    def _live_states(self) -> list[dict[str, Any]]:
        states = (self._read_state_dir(d) for d in (self._dir / "tasks").iterdir())
        return [s for s in states if s is not None and not s.get("reported")]
