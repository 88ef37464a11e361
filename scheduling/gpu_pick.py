"""The default GPU pick: which GPUs of the chosen node a replica gets, when no plugin's
``pick`` decides (FGD picks shares itself).

Whole GPUs go inside one NVLink domain where they can, shares best-fit (spread: on the
freest GPU), MIG best-fit; among equals, the coolest GPUs first (loadaware's penalty).
"""

from __future__ import annotations

from scheduling.framework import PlacementHints, Placing
from scheduling.model import GpuUse
from scheduling.node_table import NodeTable

_WHOLE: dict[int, GpuUse] = {}


def _whole(index: int) -> GpuUse:
    """The (immutable, so shared) use of a whole GPU."""
    u = _WHOLE.get(index)
    if u is None:
        u = _WHOLE[index] = GpuUse(index)
    return u


def _allowed(tbl: NodeTable, hints: PlacementHints, p: Placing, i: int, mig: bool = False) -> list[bool]:
    """Per GPU column of node ``i``: whether the replica may use it (sharing allowed, or
    for ``mig`` in MIG mode, and of the job's GPU models where the gpumodel plugin
    enforces them)."""
    ok: list[bool] = (tbl.mig_ok if mig else tbl.share_ok)[i].tolist()
    if hints.enforce_models and p.info.job.gpu_models:
        allowed = tbl.models_mask(p.info.job.gpu_models)[i].tolist()
        ok = [a and b for a, b in zip(ok, allowed, strict=True)]
    return ok


def default_pick(tbl: NodeTable, hints: PlacementHints, p: Placing, i: int) -> tuple[GpuUse, ...] | None:
    """GPUs on node ``i``: whole ones inside one NVLink domain if possible (the
    tightest that holds them; for a gang, the one that holds most of its replicas
    still to come, then one it already uses), shares best-fit (spread: most free),
    MIG best-fit. None: the replica does not fit there."""
    t, st = p.task, p.state
    if not (t.gpu or t.shared or t.mig):
        return ()
    pen = hints.gpu_penalty
    prow: list[float] = pen[i].tolist() if pen is not None else [0.0] * tbl.g
    idx = tbl.gpu_index[i]
    if t.mig:  # a free instance of the profile, on the MIG GPU with the fewest slices free
        mf = st.mig_free[i].tolist()
        okm = _allowed(tbl, hints, p, i, mig=True)
        found = [(mf[j].bit_count(), prow[j], j, x) for j, geom in enumerate(tbl.mig_inst[i]) if okm[j]
                 for x in geom if x.profile == t.mig_profile and mf[j] & x.mask == x.mask]
        if not found:
            return None
        _, _, j, x = min(found, key=lambda f: (*f[:3], f[3].start))
        return (GpuUse(idx[j], 0, 0, t.mig_slices, x.mask),)
    gm, gc, tot = st.gpu_rows(i)
    ok = _allowed(tbl, hints, p, i)
    if t.gpu:
        idle = [j for j in range(len(idx)) if ok[j] and gc[j] >= 100 and gm[j] >= tot[j]]
        if len(idle) < t.gpu:
            return None
        if not tbl.multi_domain:  # one NVLink domain per node: the coolest idle GPUs
            chosen = sorted(idle, key=lambda c: (prow[c], c))[: t.gpu]
            return tuple(_whole(idx[j]) for j in sorted(chosen))
        dom = tbl.nvlink[i].tolist()
        groups: dict[int, list[int]] = {}
        for j in idle:
            groups.setdefault(dom[j], []).append(j)
        fitting = [d for d, cs in groups.items() if len(cs) >= t.gpu]
        if fitting:
            # the domain that holds the most of the gang's replicas still to come
            # (a single replica: any), then the tightest
            left, mine = p.remaining, p.domains.get(i, ())
            d = min(fitting, key=lambda d: (-min(len(groups[d]) // t.gpu, left), d not in mine,
                                            len(groups[d]), d))
            chosen = sorted(groups[d], key=lambda c: (prow[c], c))[: t.gpu]
        else:  # span the fewest domains: the fullest first
            chosen = []
            for d in sorted(groups, key=lambda d: (-len(groups[d]), d)):
                chosen += sorted(groups[d], key=lambda c: (prow[c], c))
            chosen = chosen[: t.gpu]
        return tuple(_whole(idx[j]) for j in sorted(chosen))
    cols = [j for j in range(len(idx))
            if ok[j] and gm[j] >= t.gpu_memory_mib and gc[j] >= t.gpu_compute_pct]
    if not cols:
        return None
    sign = -1 if hints.spread else 1
    j = min(cols, key=lambda c: (sign * gc[c], sign * gm[c], prow[c], c))
    return (GpuUse(idx[j], t.gpu_memory_mib, t.gpu_compute_pct),)
