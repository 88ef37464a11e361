"""The lease stamps of an agent process's nodes, kept in one file written once per round:
a restarted agent reads how old each lease is, a crash before a round is written leaves
older stamps (so a restart fences sooner, never later), a torn or missing book reads as
no stamp, and a node the book does not know reads the file an older agent wrote."""

from __future__ import annotations

import time
from pathlib import Path

from services.node_agent.lease import Lease, LeaseBook


def test_a_round_of_renewals_is_one_write_that_a_restart_reads(tmp_path: Path) -> None:
    now = [1000.0]
    book = LeaseBook(tmp_path / "node0.leases.json")
    leases = [Lease(12.0, clock=lambda: now[0], book=book, key=f"node0-{i}")
              for i in range(3)]
    now[0] = 1010.0
    for lease in leases:
        lease.renew(1005.0)  # the round's heartbeat went out 5 s ago
    assert not book.path.exists()  # nothing written per node
    book.flush()
    # a restart now: each lease is as old as that heartbeat, not fresh
    restarted = LeaseBook(book.path)
    for i in range(3):
        age = Lease(12.0, book=restarted, key=f"node0-{i}").age()
        assert 4.5 < age < 8.0
    assert Lease(12.0, book=restarted, key="unknown").age() < 0.5  # never stamped: full


def test_a_crash_before_the_write_leaves_the_older_stamps(tmp_path: Path) -> None:
    book = LeaseBook(tmp_path / "b.json")
    lease = Lease(12.0, book=book, key="n")
    lease.renew(time.monotonic())
    book.flush()
    first = LeaseBook(book.path).get("n")
    time.sleep(0.05)
    lease.renew(time.monotonic())  # renewed, but the process dies before the flush
    assert LeaseBook(book.path).get("n") == first


def test_a_torn_book_reads_as_no_stamp_and_an_older_agents_file_is_read(
        tmp_path: Path) -> None:
    book_path = tmp_path / "b.json"
    book_path.write_text('{"n": 12')  # torn
    assert LeaseBook(book_path).get("n") is None
    legacy = tmp_path / "n" / "lease"
    legacy.parent.mkdir()
    legacy.write_text(f"{time.time() - 20:.3f}")  # an older agent's own file: 20 s ago
    lease = Lease(12.0, legacy, book=LeaseBook(book_path), key="n")
    assert lease.expired() and lease.age() > 19
