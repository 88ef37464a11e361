"""Ports for the embedded stack's services, broker and PostgreSQL.

A supervised child restarts on the port it had (the others were told its address). The
port must therefore lie outside the kernel's ephemeral range: while the child was down,
any outgoing connection on the machine could have been given that port as its local one,
and the restart would fail to bind ("address already in use") for as long as that
connection lived. Asking the kernel for port 0 hands out exactly such a port.
"""

from __future__ import annotations

import itertools
import random
import socket
from pathlib import Path

FLOOR = 20000  # below it sit well-known services' ports (5432, 9092, 8080 ...)
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
IANA_EPHEMERAL = (49152, 65535)  # where the file is missing (macOS, BSD)


def ephemeral_range(path: Path = RANGE_FILE) -> tuple[int, int]:
    try:
        low, high = (int(n) for n in path.read_text().split())
    except (OSError, ValueError):
        return IANA_EPHEMERAL
    return low, high


def candidates(low: int) -> range:
    """The ports we pick from: between FLOOR and the ephemeral range's start."""
    if low - FLOOR >= 1000:
        return range(FLOOR, low)
    return range(1024, max(low, 2048))  # a machine whose ephemeral range starts low


_pool = candidates(ephemeral_range()[0])
# a random start keeps concurrent processes apart; the walk never repeats a port this
# process handed out until it has gone round the whole pool
_start = random.randrange(len(_pool))
_next = itertools.count()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to now, outside the ephemeral range."""
    for _ in range(len(_pool)):
        port = _pool[(_start + next(_next)) % len(_pool)]
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue  # in use, or in TIME_WAIT: the next one
            return port
    with socket.socket() as s:  # every port in the pool is taken: let the kernel choose
        s.bind((host, 0))
        return int(s.getsockname()[1])
