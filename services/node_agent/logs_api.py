"""The agent's log endpoint: ``GET /logs/{job_id}?node=&task=&attempt=&tail=&follow=``.

The gateway proxies ``GET /v1/jobs/{id}/logs`` here (it checks the caller's tenant; the
agent trusts the network or, where ``KAIROS_AGENT_TOKEN`` is set, a shared bearer token).
A task is ``job/task/attempt``: without ``task`` the job's first task this node knows,
without ``attempt`` its latest. ``follow`` streams new output until the task ends (or the
client leaves), polling the log every ``poll_s``: the local runtime's log file is read
from the last offset, the others' output (simulated, Kubernetes) is read whole and only
what is new is sent. The chosen task comes back in ``X-Kairos-Task``.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Query, status
from fastapi.responses import PlainTextResponse, StreamingResponse

from services.node_agent.agent import NodeAgent


class LogReader:
    """Bytes of one task's output from an offset, whatever the runtime."""

    def __init__(self, runtime: Any, key: str) -> None:
        self.runtime = runtime
        self.key = key
        log_path = getattr(runtime, "log_path", None)
        self.path: Path | None = log_path(key) if log_path is not None else None

    def exists(self) -> bool:
        if self.path is not None:
            return self.path.exists()
        try:
            self.runtime.logs(self.key, tail=0)
        except KeyError:
            return False
        return True

    def read_from(self, offset: int) -> bytes:
        if self.path is not None:
            with open(self.path, "rb") as f:
                f.seek(offset)
                return f.read()
        return str(self.runtime.logs(self.key)).encode()[offset:]

    def head(self, lines: int | None) -> tuple[bytes, int]:
        """The last ``lines`` lines (everything without a limit) and the offset a follower
        goes on from. A large file is read backwards only as far as the lines asked for."""
        if self.path is None:
            data = str(self.runtime.logs(self.key)).encode()
            return _last_lines(data, lines), len(data)
        with open(self.path, "rb") as f:
            size = f.seek(0, 2)
            if lines is None:
                f.seek(0)
                return f.read(size), size
            block = 64 * 1024
            while True:
                start = max(0, size - block)
                f.seek(start)
                data = f.read(size - start)
                if start == 0 or data.count(b"\n") > lines:
                    return _last_lines(data, lines), size
                block *= 4


def _last_lines(data: bytes, lines: int | None) -> bytes:
    if lines is None:
        return data
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:] if lines else [])


def _choose(agents: Mapping[str, NodeAgent], job_id: str, node: str | None, task: str | None,
            attempt: int | None) -> tuple[NodeAgent, str]:
    """The agent and task key to read; HTTPException 404 when there is none."""
    if node is not None and node not in agents:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"node {node} is not served here")
    candidates = [agents[node]] if node is not None else list(agents.values())
    for agent in candidates:
        keys = [k.split("/") for k in agent.log_keys(job_id)]
        keys = [k for k in keys if (task is None or k[1] == task)
                and (attempt is None or int(k[2]) == attempt)]
        if keys:
            latest = max(int(k[2]) for k in keys)
            chosen = min((k for k in keys if int(k[2]) == latest), key=lambda k: k[1])
            return agent, "/".join(chosen)
    if task is not None and attempt is not None and len(candidates) == 1:
        # not in memory (the agent restarted): the runtime may still hold its log
        return candidates[0], f"{job_id}/{task}/{attempt}"
    what = f"task {task} of job {job_id}" if task else f"job {job_id}"
    raise HTTPException(status.HTTP_404_NOT_FOUND,
                        detail=f"no logs yet: {what} has not run on this node")


async def _follow(agent: NodeAgent, reader: LogReader, offset: int,
                  poll_s: float) -> AsyncIterator[bytes]:
    while True:
        running = agent.running(reader.key)  # read after: nothing written before the end is lost
        chunk = await asyncio.to_thread(reader.read_from, offset)
        if chunk:
            offset += len(chunk)
            yield chunk
        if not running:
            return
        await asyncio.sleep(poll_s)


def add_log_routes(app: FastAPI, agents: Mapping[str, NodeAgent], token: str = "",
                   poll_s: float = 0.5) -> None:
    @app.get("/logs/{job_id}", response_class=PlainTextResponse)
    async def task_logs(
        job_id: str,
        node: str | None = None,
        task: str | None = None,
        attempt: Annotated[int | None, Query(ge=1)] = None,
        tail: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
        follow: bool = False,
        authorization: Annotated[str | None, Header()] = None,
    ) -> Any:
        if token and not hmac.compare_digest(authorization or "", f"Bearer {token}"):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="agent token required",
                                headers={"WWW-Authenticate": "Bearer"})
        agent, key = _choose(agents, job_id, node, task, attempt)
        reader = LogReader(agent.runtime, key)
        try:
            found = await asyncio.to_thread(reader.exists)
            head, offset = await asyncio.to_thread(reader.head, tail) if found else (b"", 0)
        except Exception as exc:  # e.g. the API server refuses a Pod still creating
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=(
                f"the {agent.runtime.name} runtime cannot read the log of {key} now: "
                f"{type(exc).__name__}: {str(exc)[:200]}")) from exc
        if not found:
            raise HTTPException(status.HTTP_404_NOT_FOUND,
                                detail=f"no logs yet for task {key.split('/')[1]} of job "
                                       f"{job_id} (attempt {key.split('/')[2]})")
        headers = {"X-Kairos-Task": key, "X-Kairos-Node": agent.node_id}
        if not follow:
            return PlainTextResponse(head.decode(errors="replace"), headers=headers)

        async def body() -> AsyncIterator[bytes]:
            yield head
            async for chunk in _follow(agent, reader, offset, poll_s):
                yield chunk

        return StreamingResponse(body(), media_type="text/plain; charset=utf-8",
                                 headers=headers)
