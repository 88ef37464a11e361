"""``ClusterState``: one cycle's free capacity as numpy arrays over nodes, with
buffered (undo-logged) changes.

Placing a gang tentatively and rolling it back whole (``mark`` / ``rollback``) is how
all-or-nothing is kept (Volcano's Statement); nothing leaves the core until the
cycle's plan is returned. The static side is ``NodeTable`` (scheduling.node_table).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduling.arrays import IntArray
from scheduling.model import Allocation, GpuUse
from scheduling.node_table import NodeTable

MAX_STATES = 1_000_000  # interned node states kept before the table starts over
FEW_ROWS = 8  # state ids of up to this many nodes are computed row by row, more in bulk


@dataclass(slots=True)
class _Change:
    node: int
    cpu: int
    mem: int
    uses: tuple[GpuUse, ...]
    sign: int


class ClusterState:
    """Free capacity for one cycle; mutate only through ``take`` / ``release``."""

    def __init__(self, table: NodeTable) -> None:
        t = table
        self.t = t
        self.cpu_free = t.cpu_total.copy()
        self.mem_free = t.mem_total.copy()
        self.gmem_free = np.where(t.share_ok, t.gmem_total, 0)
        self.gcmp_free = np.where(t.share_ok, 100, 0).astype(np.int64)
        self.mig_free = np.where(t.mig_ok, t.mig_total, 0)
        self.idle = t.gpu_count.copy()  # whole GPUs wholly free
        self.dom_idle = t.gpu_count.copy()  # most wholly free GPUs inside one NVLink domain
        self.cmp_sum = self.gcmp_free.sum(axis=1)  # free compute percent over the node
        self.log: list[_Change] = []
        self.tracking = False
        self.depth = 0
        self.dirty: list[int] = []  # nodes changed, in order: caches catch up from here
        self.cache: dict[str, Any] = {}  # per-state scratch (fit masks, FGD's state ids)
        if t.multi_domain:
            self.refresh()

    def copy(self) -> ClusterState:
        c = ClusterState.__new__(ClusterState)
        c.t = self.t
        for name in ("cpu_free", "mem_free", "gmem_free", "gcmp_free", "mig_free", "idle",
                     "dom_idle", "cmp_sum"):
            setattr(c, name, getattr(self, name).copy())
        c.log = []
        c.tracking = False
        c.depth = 0
        c.dirty = []
        c.cache = {}
        ent = self.cache.get("sid")
        if ent is not None:  # ids are of row contents, which the copy shares: keep them
            c.cache["sid"] = [ent[0].copy(), 0, ent[2]]
            c.dirty, _ = self.changed_since(ent[1])
        return c

    # --- bulk load ----------------------------------------------------------------
    def apply(self, allocations: Iterable[Allocation], sign: int = 1) -> None:
        """Subtract (sign 1) or give back (sign -1) many allocations, vectorised."""
        rows: list[int] = []
        cpus: list[int] = []
        mems: list[int] = []
        g_rows: list[int] = []
        g_cols: list[int] = []
        g_mem: list[int] = []
        g_cmp: list[int] = []
        g_mig: list[int] = []
        parts = self.t.parts
        for a in allocations:
            p = parts(a)
            if p is None:
                continue  # node gone from the inventory: nothing to account
            i, cpu, mem, cols, p_mem, p_cmp, p_mig = p
            rows.append(i)
            cpus.append(cpu)
            mems.append(mem)
            if cols:
                g_rows += [i] * len(cols)
                g_cols += cols
                g_mem += p_mem
                g_cmp += p_cmp
                g_mig += p_mig
        if not rows:
            return
        r = np.asarray(rows)
        np.subtract.at(self.cpu_free, r, sign * np.asarray(cpus, dtype=np.int64))
        np.subtract.at(self.mem_free, r, sign * np.asarray(mems, dtype=np.int64))
        if g_rows:
            gr, gc = np.asarray(g_rows), np.asarray(g_cols)
            np.subtract.at(self.gmem_free, (gr, gc), sign * np.asarray(g_mem, dtype=np.int64))
            np.subtract.at(self.gcmp_free, (gr, gc), sign * np.asarray(g_cmp, dtype=np.int64))
            np.subtract.at(self.mig_free, (gr, gc), sign * np.asarray(g_mig, dtype=np.int64))
        self.refresh(np.unique(r))

    def refresh(self, rows: IntArray | None = None) -> None:
        """Recompute the derived per-node figures (idle GPUs, free compute)."""
        t = self.t
        sl = slice(None) if rows is None else rows
        whole = (self.gcmp_free[sl] >= 100) & (self.gmem_free[sl] >= t.gmem_total[sl]) & t.share_ok[sl]
        self.idle[sl] = whole.sum(axis=1)
        if t.multi_domain:
            dom = t.nvlink[sl]
            self.dom_idle[sl] = np.max([(whole & (dom == d)).sum(axis=1) for d in t.domains], axis=0)
        else:
            self.dom_idle[sl] = self.idle[sl]
        self.cmp_sum[sl] = self.gcmp_free[sl].sum(axis=1)
        self.dirty.extend(range(t.n) if rows is None else rows.tolist())

    # --- one task at a time, undo-logged ------------------------------------------
    def take(self, i: int, cpu: int, mem: int, uses: tuple[GpuUse, ...], sign: int = 1) -> None:
        t = self.t
        if cpu:
            self.cpu_free[i] -= sign * cpu
        if mem:
            self.mem_free[i] -= sign * mem
        if uses and not t.multi_domain:
            # one NVLink domain per node: idle GPUs and free compute change by the GPUs used
            cols, tot, ok = t.col_of[i], t.gmem_total_l[i], t.share_ok_l[i]
            gm_row, gc_row = self.gmem_free[i], self.gcmp_free[i]
            d_idle = d_cmp = 0
            for u in uses:
                j = cols[u.index]
                if u.mig_slots:
                    self.mig_free[i, j] -= sign * u.mig_slots
                    continue
                m0, c0 = int(gm_row[j]), int(gc_row[j])
                if u.whole:
                    m1, c1 = m0 - sign * tot[j], c0 - sign * 100
                else:
                    m1, c1 = m0 - sign * u.memory_mib, c0 - sign * u.compute_pct
                gm_row[j], gc_row[j] = m1, c1
                if ok[j]:
                    d_idle += (c1 >= 100 and m1 >= tot[j]) - (c0 >= 100 and m0 >= tot[j])
                d_cmp += c1 - c0
            if d_idle:
                self.idle[i] += d_idle
                self.dom_idle[i] = self.idle[i]
            if d_cmp:
                self.cmp_sum[i] += d_cmp
        elif uses:
            cols = t.col_of[i]
            tot = t.gmem_total_l[i]
            gm_row, gc_row = self.gmem_free[i], self.gcmp_free[i]
            gm, gc = gm_row.tolist(), gc_row.tolist()
            for u in uses:
                j = cols[u.index]
                if u.mig_slots:
                    self.mig_free[i, j] -= sign * u.mig_slots
                elif u.whole:
                    gm[j] -= sign * tot[j]
                    gc[j] -= sign * 100
                else:
                    gm[j] -= sign * u.memory_mib
                    gc[j] -= sign * u.compute_pct
            gm_row[:] = gm
            gc_row[:] = gc
            ok = t.share_ok_l[i]
            whole = [gc[j] >= 100 and gm[j] >= tot[j] and ok[j] for j in range(len(gm))]
            self.idle[i] = n_idle = sum(whole)
            if t.multi_domain:
                per: dict[int, int] = {}
                for d, w in zip(t.nvlink_l[i], whole, strict=True):
                    if w:
                        per[d] = per.get(d, 0) + 1
                self.dom_idle[i] = max(per.values(), default=0)
            else:
                self.dom_idle[i] = n_idle
            self.cmp_sum[i] = sum(gc)
        self.dirty.append(i)
        if self.tracking:
            self.log.append(_Change(i, cpu, mem, uses, sign))

    def release(self, i: int, cpu: int, mem: int, uses: tuple[GpuUse, ...]) -> None:
        self.take(i, cpu, mem, uses, sign=-1)

    def mark(self) -> int:
        """Open a (nestable) statement; returns the position to roll back to."""
        self.depth += 1
        self.tracking = True
        return len(self.log)

    def rollback(self, mark: int) -> None:
        self.tracking = False
        while len(self.log) > mark:
            c = self.log.pop()
            self.take(c.node, c.cpu, c.mem, c.uses, -c.sign)
        self._close()

    def commit(self, mark: int) -> None:
        self._close()

    def _close(self) -> None:
        self.depth -= 1
        self.tracking = self.depth > 0
        if not self.tracking:
            self.log.clear()

    # --- questions -------------------------------------------------------------------
    def changed_since(self, cursor: int) -> tuple[list[int], int]:
        """Nodes changed after ``cursor`` (a position in ``dirty``), and the new cursor."""
        n = len(self.dirty)
        if cursor >= n:
            return [], n
        if cursor == n - 1:
            return [self.dirty[cursor]], n  # the common case: one take since
        return sorted(set(self.dirty[cursor:])), n

    def state_ids(self) -> IntArray:
        """Every node's interned state: equal ids, equal node class (inventory) and free
        capacity, up to the order of a node's GPUs where they are all of one kind; so
        any per-node figure computed from those alone, and blind to that order, is
        equal too. Kept on the state and caught up with the nodes changed since; a
        copy inherits it."""
        ent = self.cache.get("sid")
        t = self.t
        if ent is not None and ent[2] is not t.states:
            ent = None  # the table's interning was reset
        if ent is None:
            if len(t.states) > MAX_STATES:
                t.states = {}
            ent = self.cache["sid"] = [np.empty(t.n, dtype=np.int64), len(self.dirty), t.states]
            rows = list(range(t.n))
        else:
            rows, ent[1] = self.changed_since(ent[1])
            if not rows:
                return ent[0]  # type: ignore[no-any-return]
        sid: IntArray = ent[0]
        states = t.states
        if len(rows) <= FEW_ROWS:  # the common case, a node or two since: plain Python is quicker
            if t.raw_for is not states or len(t.raw_states) > MAX_STATES:
                t.raw_states, t.raw_for = {}, states
            raw = t.raw_states
            gm, gc, mig, cpu, mem, layout = (self.gmem_free, self.gcmp_free, self.mig_free, self.cpu_free,
                                             self.mem_free, t.layout_l)
            for i in rows:
                k = (layout[i], cpu.item(i), mem.item(i), gm[i].tobytes(), gc[i].tobytes(), mig[i].tobytes())
                v = raw.get(k)
                if v is None:
                    v = raw[k] = states.setdefault(self._state_key(i), len(states))
                sid[i] = v
            return sid
        r = np.asarray(rows, dtype=np.int64)
        gm, gc, mig = self.gmem_free[r], self.gcmp_free[r], self.mig_free[r]
        in_range = ((gm >= 0) & (gm < 1 << 24) & (gc >= 0) & (gc < 256) & (mig >= 0) & (mig < 256)).all(axis=1)
        canon = t.gpu_order_free[r] & in_range
        cls = t.gpu_class[r]
        if canon.any():
            codes = np.sort((((cls << 24 | gm) << 8 | gc) << 8) | mig, axis=1)
            c = canon[:, None]
            gm, gc, mig, cls = (np.where(c, codes, gm), np.where(c, 0, gc), np.where(c, 0, mig),
                                np.where(c, 0, cls))
        m = np.concatenate([t.node_class[r, None], canon[:, None], self.cpu_free[r, None], self.mem_free[r, None],
                            gm, gc, mig, cls], axis=1)
        # each distinct row once (rows compared as bytes: equal length, so distinct stay distinct)
        _, first, inv = np.unique(np.ascontiguousarray(m).view(f"S{m.shape[1] * 8}").ravel(),
                                  return_index=True, return_inverse=True)
        sid[r] = np.asarray([states.setdefault(tuple(row), len(states)) for row in m[first].tolist()],
                            dtype=np.int64)[inv.ravel()]
        return sid

    def _state_key(self, i: int) -> tuple[int, ...]:
        """Node ``i``'s state as ``state_ids`` keys it: its class, whether its GPUs are
        taken in sorted order, free CPU and memory, then per GPU: where sorted, one code
        each (class, free memory, compute, MIG slices) and zeros; else the free memory,
        compute and MIG slices and the class of each GPU in place."""
        t = self.t
        gm, gc, mig, cls = (self.gmem_free[i].tolist(), self.gcmp_free[i].tolist(), self.mig_free[i].tolist(),
                            t.gpu_class_l[i])
        g = len(gm)
        if t.gpu_order_free_l[i] and all(0 <= a < 1 << 24 and 0 <= b < 256 and 0 <= c < 256
                                         for a, b, c in zip(gm, gc, mig, strict=True)):
            codes = sorted((((k << 24 | a) << 8 | b) << 8) | c for k, a, b, c in zip(cls, gm, gc, mig, strict=True))
            zeros = [0] * g
            return (t.node_class_l[i], 1, int(self.cpu_free[i]), int(self.mem_free[i]), *codes, *zeros, *zeros,
                    *zeros)
        return (t.node_class_l[i], 0, int(self.cpu_free[i]), int(self.mem_free[i]), *gm, *gc, *mig, *cls)

    def gpu_rows(self, i: int) -> tuple[list[int], list[int], list[int]]:
        """Free memory, free compute and total memory of node ``i``'s GPU columns."""
        return (self.gmem_free[i].tolist(), self.gcmp_free[i].tolist(),
                self.t.gmem_total[i].tolist())
