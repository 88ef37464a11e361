"""The pending jobs' numbers as numpy columns, one row per cached ``JobInfo``.

A cluster under load has thousands of jobs waiting; walking them as Python objects in
every plugin, every cycle, is what made a cycle slow. Each job gets a row when its
``JobInfo`` is built; a cycle gathers the rows of the jobs pending now (one fancy
index), so ordering keys and the bulk settling of the jobs left over are array work.
Rows of jobs that leave the pending set are reused.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from scheduling.arrays import FloatArray, IntArray

SUBMIT, STATIC, GPUS, SHAPE, PSHAPE, ESTIMATE, ATTAINED, CPU, MEM, TENANT = range(10)
FIELDS = 10


class JobColumns:
    def __init__(self, capacity: int = 1024, fields: int = FIELDS) -> None:
        self.data: FloatArray = np.zeros((fields, capacity))
        self.free: list[int] = list(range(capacity - 1, -1, -1))
        self.tenants: dict[str, int] = {}

    def add(self, row: tuple[float, ...]) -> int:
        if not self.free:
            cap = self.data.shape[1]
            self.data = np.concatenate([self.data, np.zeros((self.data.shape[0], cap))], axis=1)
            self.free = list(range(2 * cap - 1, cap - 1, -1))
        k = self.free.pop()
        self.data[:, k] = row
        return k

    def tenant_code(self, tenant: str) -> int:
        return self.tenants.setdefault(tenant, len(self.tenants))

    def release(self, rows: Iterable[int]) -> None:
        self.free.extend(rows)

    def gather(self, rows: IntArray) -> FloatArray:
        """The columns of these rows, in this order: shape (fields, len(rows))."""
        return self.data[:, rows]


def groups(codes: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """``np.unique(codes, return_index=True, return_inverse=True)`` for small
    non-negative integer codes (interned shapes, tenants), by counting instead of
    sorting (thousands of waiting jobs, every cycle): the distinct codes ascending, the
    first position of each, and each element's group."""
    n = len(codes)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    present = np.zeros(int(codes.max()) + 1, dtype=bool)
    present[codes] = True
    inverse = (np.cumsum(present) - 1)[codes]
    uniq = np.flatnonzero(present)
    first = np.full(len(uniq), n, dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(n))
    return uniq, first, inverse
