"""GPU-share isolation: the CUDA MPS control daemon and the environment of a share.

When several tasks share one physical GPU, each runs as a client of the MPS server with
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its compute share) and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (its memory share), both enforced by MPS (Volta and
later). Frameworks get hints that make them stay within the share (no preallocation of the
whole GPU); the watchdog (``watchdog.py``) enforces memory where MPS is unavailable. See
docs/design/node-agent.md for what is a hard limit and what is best effort.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from services.node_agent.runtimes.base import GpuGrant

log = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"

# enforced by the platform: a job's own env cannot override them
ENFORCED_VARS = frozenset({
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "KAIROS_GPU_MEMORY_LIMIT_MIB", "KAIROS_GPU_COMPUTE_PCT", "KAIROS_GPU_MEMORY_FRACTION",
})


def _shared(g: GpuGrant) -> bool:
    """A share of a GPU; a MIG instance never is (the hardware isolates it: no MPS)."""
    return not g.is_mig and (g.memory_mib > 0 or g.compute_pct < 100)


def is_share(grants: Sequence[GpuGrant]) -> bool:
    return any(_shared(g) for g in grants)


def share_env(grants: Sequence[GpuGrant],
              device_memory_mib: Mapping[int, int] | None = None) -> dict[str, str]:
    """Variables that hold a task to its GPU shares; empty for whole GPUs.

    Device ordinals in ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` are the ones the task sees,
    i.e. positions in its ``CUDA_VISIBLE_DEVICES`` (the order of ``grants``), not host
    indices. ``device_memory_mib`` (host index -> MiB) lets memory fractions be given to
    frameworks that take a fraction rather than a size.
    """
    if not is_share(grants):
        return {}
    env: dict[str, str] = {}
    compute = [g.compute_pct for g in grants if _shared(g) and g.compute_pct < 100]
    if compute:  # one value per client process: the smallest share binds
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(compute)))
    limits = [f"{pos}={g.memory_mib}M" for pos, g in enumerate(grants) if _shared(g)
              and g.memory_mib > 0]
    if limits:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
    env["KAIROS_GPU_MEMORY_LIMIT_MIB"] = ",".join(
        str(g.memory_mib if _shared(g) else 0) for g in grants)
    env["KAIROS_GPU_COMPUTE_PCT"] = ",".join(
        str(g.compute_pct if _shared(g) else 100) for g in grants)
    totals = device_memory_mib or {}
    fractions = [g.memory_mib / totals[g.index] for g in grants
                 if _shared(g) and g.memory_mib > 0 and totals.get(g.index)]
    # framework hints (a job may override these in its own env)
    env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if fractions:
        fraction = f"{int(min(fractions) * 100) / 100:.2f}"  # rounded down
        env["KAIROS_GPU_MEMORY_FRACTION"] = fraction  # torch.cuda.set_per_process_memory_fraction
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fraction
    else:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def merge_env(base: Mapping[str, str], job_env: Mapping[str, str],
              platform: Mapping[str, str]) -> dict[str, str]:
    """base < framework hints < job env < platform-enforced variables."""
    hints = {k: v for k, v in platform.items() if k not in ENFORCED_VARS}
    enforced = {k: v for k, v in platform.items() if k in ENFORCED_VARS}
    return {**base, **hints, **job_env, **enforced}


class MpsDaemon:
    """The node's CUDA MPS control daemon, started on the first shared GPU, stopped on close.

    ``ensure_started()`` answers whether shares can run under MPS; where the binary is
    missing or will not start, ``reason`` says why ("mps unavailable: ...") and tasks run
    without MPS (hints and watchdog only).
    """

    def __init__(self, state_dir: str | os.PathLike[str], binary: str = MPS_CONTROL,
                 visible_devices: str | None = None) -> None:
        self.pipe_dir = Path(state_dir) / "mps" / "pipe"
        self.log_dir = Path(state_dir) / "mps" / "log"
        self._binary = shutil.which(binary)
        self._visible = visible_devices
        self._started = False
        self._lock = asyncio.Lock()
        self.reason = "" if self._binary else f"mps unavailable: {binary} not found"

    @property
    def available(self) -> bool:
        return self._binary is not None and not self.reason

    @property
    def running(self) -> bool:
        return self._started

    def client_env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def _env(self) -> dict[str, str]:
        env = {**os.environ, **self.client_env()}
        if self._visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = self._visible
        return env

    async def _control(self, *args: str, stdin: bytes | None = None) -> tuple[int, str]:
        assert self._binary is not None
        proc = await asyncio.create_subprocess_exec(
            self._binary, *args, env=self._env(),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate(stdin)
        return proc.returncode or 0, out.decode(errors="replace").strip()

    async def ensure_started(self) -> bool:
        async with self._lock:
            if self._started:
                return True
            if not self.available:
                return False
            self.pipe_dir.mkdir(parents=True, exist_ok=True)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            try:
                code, out = await self._control("-d")  # forks the daemon and returns
            except OSError as exc:
                code, out = -1, str(exc)
            if code != 0 and not (self.pipe_dir / "control").exists():
                self.reason = f"mps unavailable: {MPS_CONTROL} -d exited {code}: {out}"
                log.warning(self.reason)
                return False
            # exit 0, or refused because a daemon (e.g. of our previous run) already serves
            self._started = True
            log.info("MPS control daemon serving pipe dir %s", self.pipe_dir)
            return True

    async def stop(self) -> None:
        async with self._lock:
            if not self._started:
                return
            self._started = False
            try:
                code, out = await self._control(stdin=b"quit\n")
            except OSError as exc:
                code, out = -1, str(exc)
            if code != 0:
                log.warning("MPS control daemon did not quit cleanly: %s", out)
