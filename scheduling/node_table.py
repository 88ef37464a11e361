"""``NodeTable``: what does not change between cycles (inventory, topology, labels),
as arrays over nodes and GPUs.

The scheduler keeps it while the snapshot's ``nodes`` tuple is the same object (see
``SnapshotCache``); it also interns node classes and states for ``ClusterState``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduling.arrays import BoolArray, IntArray
from scheduling.mig import NEVER, Instance
from scheduling.model import Allocation, Node

NVLINK_DOMAIN = "kairos.io/nvlink-domain"  # nodes one NVLink fabric joins (NVL72); default: the node
PARTS_KEPT = 1 << 16  # allocations whose parts a node table keeps before it starts over


def _codes(values: Sequence[str]) -> tuple[IntArray, list[str]]:
    names: dict[str, int] = {}
    codes = [names.setdefault(v, len(names)) for v in values]
    return np.asarray(codes, dtype=np.int64), list(names)


class NodeTable:
    """The static part of the cluster: inventory and topology, as arrays."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.src = nodes  # the caller's object, to know when to rebuild
        self._parts: dict[int, tuple[Allocation, tuple[int, int, int, list[int], list[int], list[int],
                                                        list[int]] | None]] = {}
        self.nodes = tuple(nodes)
        n = len(self.nodes)
        g = max((len(x.gpus) for x in self.nodes), default=0) or 1
        self.n, self.g = n, g
        self.node_ids = [x.node_id for x in self.nodes]
        self.index = {nid: i for i, nid in enumerate(self.node_ids)}
        self.cpu_total = np.asarray([x.cpu_milli for x in self.nodes], dtype=np.int64)
        self.mem_total = np.asarray([x.memory_mib for x in self.nodes], dtype=np.int64)
        self.schedulable = np.asarray([x.schedulable for x in self.nodes], dtype=bool)
        self.cordoned = np.asarray([x.cordoned and not x.schedulable for x in self.nodes],
                                   dtype=bool)
        self.rack, self.racks = _codes([x.rack for x in self.nodes])
        self.gmem_total = np.zeros((n, g), dtype=np.int64)
        self.exists = np.zeros((n, g), dtype=bool)
        self.healthy = np.zeros((n, g), dtype=bool)
        self.mig_total = np.zeros((n, g), dtype=np.int64)  # memory slices its MIG instances span
        self.mig_mode = np.zeros((n, g), dtype=bool)
        self.mig_geom = np.zeros((n, g), dtype=np.int64)  # its instances, interned (0: none)
        geoms: dict[tuple[Instance, ...], int] = {(): 0}
        self.nvlink = np.zeros((n, g), dtype=np.int64)
        models: dict[str, int] = {}
        self.gmodel = np.full((n, g), -1, dtype=np.int64)
        for i, x in enumerate(self.nodes):
            for j, s in enumerate(x.gpus):
                # GPU positions follow the list; GpuUse.index is the slot's index field.
                self.gmem_total[i, j] = s.memory_mib
                self.exists[i, j] = True
                self.healthy[i, j] = s.healthy
                self.mig_total[i, j] = sum(m.mask for m in s.mig)
                self.mig_mode[i, j] = s.mig_mode
                self.mig_geom[i, j] = geoms.setdefault(s.mig, len(geoms))
                self.nvlink[i, j] = s.nvlink_domain
                self.gmodel[i, j] = models.setdefault(s.model, len(models))
        self.models = list(models)
        self.gpu_index = [[s.index for s in x.gpus] for x in self.nodes]
        # list mirrors for per-node Python work (faster than numpy on 8 elements)
        self.gmem_total_l: list[list[int]] = self.gmem_total.tolist()
        self.nvlink_l: list[list[int]] = self.nvlink.tolist()
        self.col_of = [{s.index: j for j, s in enumerate(x.gpus)} for x in self.nodes]
        # usable for whole GPUs and shares: present, healthy, not in MIG mode
        self.share_ok = self.exists & self.healthy & ~self.mig_mode
        self.mig_ok = self.exists & self.healthy & self.mig_mode
        self.mig_inst = [[s.mig for s in x.gpus] for x in self.nodes]
        self.gpu_count = self.share_ok.sum(axis=1).astype(np.int64)
        self.share_ok_l: list[list[bool]] = self.share_ok.tolist()
        # NVLink domains as one-hot columns, for "idle GPUs inside one domain" per node
        self.domains = sorted(set(self.nvlink[self.exists].tolist())) or [0]
        self.multi_domain = bool(
            (self.nvlink.max(axis=1, initial=0) != self.nvlink.min(axis=1, initial=0)).any())
        self.mask_cache: dict[object, BoolArray] = {}
        self.mig_cache: dict[str, IntArray] = {}
        self.domain_cache: dict[str, IntArray] = {}
        # interned node states (see ClusterState.state_ids): what a node is (its class)
        # and has free; kept while the table is, up to MAX_STATES
        gclasses: dict[tuple[int, ...], int] = {}
        per_gpu = np.stack([self.gmem_total, self.share_ok, self.mig_geom, self.mig_ok, self.nvlink,
                            self.gmodel, self.exists], axis=2).tolist()
        self.gpu_class = np.asarray([[gclasses.setdefault(tuple(c), len(gclasses)) for c in row]
                                     for row in per_gpu], dtype=np.int64).reshape(n, g)
        # a node whose usable GPUs are all of one model and size may list them in any
        # order: its state is taken with its GPUs sorted, so permutations share an id
        usable = self.share_ok | self.mig_ok
        kinds = [{(m, t, s) for m, t, s, u in zip(self.gmodel[i].tolist(), self.gmem_total[i].tolist(),
                                                  self.mig_geom[i].tolist(), usable[i].tolist(), strict=True) if u}
                 for i in range(n)]
        self.gpu_order_free = np.asarray([len(k) <= 1 for k in kinds], dtype=bool)
        classes: dict[tuple[object, ...], int] = {}
        self.node_class = np.asarray([classes.setdefault((
            x.cpu_milli, x.memory_mib, bool(self.gpu_order_free[i]),
            tuple(sorted(self.gpu_class[i].tolist())) if self.gpu_order_free[i] else tuple(self.gpu_class[i].tolist())),
            len(classes)) for i, x in enumerate(self.nodes)], dtype=np.int64)
        self.states: dict[tuple[int, ...], int] = {}
        self.gpu_class_l: list[list[int]] = self.gpu_class.tolist()
        self.gpu_order_free_l: list[bool] = self.gpu_order_free.tolist()
        self.node_class_l: list[int] = self.node_class.tolist()
        # nodes alike GPU by GPU in place (class and layout): their raw free arrays map to
        # the same state id, so a raw row's id is memoised (``raw_states``, for ``states``)
        layouts: dict[tuple[object, ...], int] = {}
        self.layout_l: list[int] = [layouts.setdefault((c, *row), len(layouts))
                                    for c, row in zip(self.node_class_l, self.gpu_class_l, strict=True)]
        self.raw_states: dict[tuple[object, ...], int] = {}
        self.raw_for: object = self.states

    def models_mask(self, allowed: tuple[str, ...]) -> BoolArray:
        """Per GPU: its model is allowed (all, when ``allowed`` is empty)."""
        key = ("gpu_models", allowed)
        m = self.mask_cache.get(key)
        if m is None:
            codes = [self.models.index(a) for a in allowed if a in self.models]
            m = np.isin(self.gmodel, codes) if allowed else self.exists.copy()
            self.mask_cache[key] = m
        return m

    def domains_of(self, scope: str) -> IntArray:
        """Per node, the code of its domain at ``scope`` (an affinity's topology): "node",
        "rack", or a node label key (-1: the node lacks the label, so it is in no domain;
        an NVLink domain defaults to the node itself, as NVLink ends at an HGX board)."""
        codes = self.domain_cache.get(scope)
        if codes is None:
            if scope == "node":
                codes = np.arange(self.n, dtype=np.int64)
            elif scope == "rack":
                codes = self.rack
            else:
                values = [x.labels.get(scope, x.node_id if scope == NVLINK_DOMAIN else None) for x in self.nodes]
                found, _ = _codes([v or "" for v in values])
                codes = np.where([v is not None for v in values], found, -1).astype(np.int64)
            self.domain_cache[scope] = codes
        return codes

    def mig_masks(self, profile: str) -> IntArray:
        """Per GPU, the memory-slice masks of its MIG instances of ``profile``, padded with
        a mask never free: (nodes, GPUs, most instances of it on one GPU)."""
        m = self.mig_cache.get(profile)
        if m is None:
            rows = [[[x.mask for x in geom if x.profile == profile] for geom in node] for node in self.mig_inst]
            k = max((len(c) for node in rows for c in node), default=0) or 1
            m = np.full((self.n, self.g, k), NEVER, dtype=np.int64)
            for i, node in enumerate(rows):
                for j, c in enumerate(node):
                    m[i, j, :len(c)] = c
            self.mig_cache[profile] = m
        return m

    def mig_count(self, profile: str) -> IntArray:
        """Per node, its healthy MIG instances of ``profile``."""
        out: IntArray = ((self.mig_masks(profile) < NEVER) & self.mig_ok[:, :, None]).sum(axis=(1, 2), dtype=np.int64)
        return out

    def parts(self, a: Allocation) -> tuple[int, int, int, list[int], list[int], list[int], list[int]] | None:
        """What an allocation takes, as ``ClusterState.apply`` adds it up: node index,
        CPU, memory, and per GPU its column, memory, compute and MIG mask (None: the
        node is not in the inventory). Kept per allocation object: the reservation
        search applies the same running jobs' allocations again and again."""
        hit = self._parts.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
        i = self.index.get(a.node_id)
        out = None
        if i is not None:
            cols = self.col_of[i]
            g_cols: list[int] = []
            g_mem: list[int] = []
            g_cmp: list[int] = []
            g_mig: list[int] = []
            for u in a.gpus:
                j = cols.get(u.index)
                if j is None:
                    continue
                g_cols.append(j)
                if u.mig_slots:
                    g_mem.append(0)
                    g_cmp.append(0)
                    g_mig.append(u.mig_slots)
                elif u.whole:
                    g_mem.append(int(self.gmem_total[i, j]))
                    g_cmp.append(100)
                    g_mig.append(0)
                else:
                    g_mem.append(u.memory_mib)
                    g_cmp.append(u.compute_pct)
                    g_mig.append(0)
            out = (i, a.cpu_milli, a.memory_mib, g_cols, g_mem, g_cmp, g_mig)
        if len(self._parts) >= PARTS_KEPT:
            self._parts.clear()  # allocations come and go: start over rather than grow
        self._parts[id(a)] = (a, out)  # holds the object, so its id is not reused meanwhile
        return out

