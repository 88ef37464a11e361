"""Interactive environments on a node: the port a session listens on, and where to reach it.

The agent allocates the port before the task starts, passes it as ``KAIROS_PORT`` and
reports the connection with the task's ``running`` status:

- local processes: a free TCP port of this host (the OS picks it; the task listens on it);
- Kubernetes: the container port ``KAIROS_PORT`` of the task's Pod, on the Pod network:
  ``host`` is the Pod's DNS name ``rank-0.<gang>.<namespace>.svc`` (the name every
  gang's rendezvous uses) and ``service`` the gang's headless Service in front of it,
  which lists the port as ``session`` (``kubectl port-forward svc/<service> <port>``);
- simulated nodes: a port from a deterministic range; nothing listens (``simulated``).
"""

from __future__ import annotations

import socket
import zlib

from services.node_agent.runtimes.kubernetes_names import gang_service
from shared.events import Connection

KUBERNETES_PORT = 8888  # the container port of an interactive Pod
SIMULATED_BASE, SIMULATED_SPAN = 30000, 20000


def free_port(host: str = "") -> int:
    """A TCP port nothing listens on now; the task binds it right after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def allocate(runtime: str, address: str, key: str, host: str = "") -> Connection:
    """Where the session of task ``key`` will listen, for the node's runtime; ``host``:
    the name the runtime gives the task (a Pod's DNS name), else the node's address."""
    if runtime == "process":
        return Connection(host=address, port=free_port())
    if runtime == "kubernetes":
        job_id, _, attempt = key.split("/")
        return Connection(host=host or address, port=KUBERNETES_PORT,
                          service=gang_service(job_id, int(attempt)))
    port = SIMULATED_BASE + zlib.crc32(key.encode()) % SIMULATED_SPAN
    return Connection(host=address, port=port, simulated=True)


def session_env(conn: Connection) -> dict[str, str]:
    return {"KAIROS_PORT": str(conn.port)} if conn.port is not None else {}
