"""The embedded stack's ports lie outside the kernel's ephemeral range, so a child that
restarts on its old port cannot find it taken by some outgoing connection's local end."""

from __future__ import annotations

import socket
from pathlib import Path

from kairos import ports


def test_handed_out_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    low, _ = ports.ephemeral_range()
    handed = [ports.free_port() for _ in range(300)]
    assert len(set(handed)) == len(handed)
    assert all(1024 <= p < low for p in handed)
    with socket.socket() as s:  # what it hands out can be bound
        s.bind(("127.0.0.1", handed[-1]))


def test_a_port_in_use_is_skipped() -> None:
    taken = []
    try:
        for _ in range(50):  # hold what it hands out: it must never hand it out again
            port = ports.free_port()
            assert port not in {t.getsockname()[1] for t in taken}
            s = socket.socket()
            taken.append(s)
            s.bind(("127.0.0.1", port))
    finally:
        for s in taken:
            s.close()


def test_an_outgoing_connection_never_gets_a_handed_out_port() -> None:
    # the real contract behind the rule: the kernel picks local ports of outgoing
    # connections from the ephemeral range, which the handed-out ports avoid
    low, high = ports.ephemeral_range()
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports.free_port()))
        server.listen(64)
        clients = [socket.create_connection(server.getsockname()) for _ in range(20)]
        try:
            assert all(low <= c.getsockname()[1] <= high for c in clients)
        finally:
            for c in clients:
                c.close()


def test_the_range_is_read_from_the_kernel_or_falls_back_to_ianas(tmp_path: Path) -> None:
    f = tmp_path / "ip_local_port_range"
    f.write_text("32768\t60999\n")
    assert ports.ephemeral_range(f) == (32768, 60999)
    assert ports.ephemeral_range(tmp_path / "missing") == ports.IANA_EPHEMERAL
    f.write_text("garbage")
    assert ports.ephemeral_range(f) == ports.IANA_EPHEMERAL
    assert ports.candidates(32768) == range(ports.FLOOR, 32768)
    assert ports.candidates(10000) == range(1024, 10000)  # an unusually low range
