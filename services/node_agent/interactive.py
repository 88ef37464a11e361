"""Interactive environments on a node: the port a session listens on, and where to reach it.

The agent allocates the port before the task starts, passes it as ``KAIROS_PORT`` and
reports the connection with the task's ``running`` status:

- local processes: a free TCP port of this host (the OS picks it; the task listens on it);
- Kubernetes: the container port ``KAIROS_PORT`` of the task's Pod, named in ``service``
  (the Pod's name, in the agent's namespace);
- simulated nodes: a port from a deterministic range; nothing listens (``simulated``).
"""

from __future__ import annotations

import socket
import zlib

from shared.events import Connection

KUBERNETES_PORT = 8888  # the container port of an interactive Pod
SIMULATED_BASE, SIMULATED_SPAN = 30000, 20000


def free_port(host: str = "") -> int:
    """A TCP port nothing listens on now; the task binds it right after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def allocate(runtime: str, address: str, key: str) -> Connection:
    """Where the session of task ``key`` will listen, for the node's runtime."""
    if runtime == "process":
        return Connection(host=address, port=free_port())
    if runtime == "kubernetes":
        from services.node_agent.runtimes.kubernetes import pod_name  # the client is heavy

        return Connection(host=address, port=KUBERNETES_PORT, service=pod_name(key))
    port = SIMULATED_BASE + zlib.crc32(key.encode()) % SIMULATED_SPAN
    return Connection(host=address, port=port, simulated=True)


def session_env(conn: Connection) -> dict[str, str]:
    return {"KAIROS_PORT": str(conn.port)} if conn.port is not None else {}
