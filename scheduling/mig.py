"""MIG: a GPU split by hardware into instances, each with its own compute slices, memory
and L2, isolated from the others (NVIDIA's Multi-Instance GPU).

An instance's profile is named ``<g>g.<mem>gb`` (``1g.10gb``: one of the GPU's seven
compute slices and 10 GB). Where an instance may sit is fixed by the hardware: a GPU has
eight memory slices, each profile spans ``size`` of them and may begin only at its
``starts`` (NVIDIA's placement tables, the same on A100, A800, H100, H800, H200 and B200;
``nvidia-smi mig -lgipp`` prints them). An instance is (profile, start, size), as NVML's
``nvmlGpuInstanceGetInfo`` reports its placement.

The core works on masks of memory slices: a GPU's free mask holds the slices of the
instances configured on it that no task holds; a task asking for a profile takes a free
instance of that name, and the instance's mask leaves the free mask. Instances never
overlap, so a mask-and says exactly whether one is free. A30 (four slices) is not in the
tables: its instances are still placed by name, their share of the GPU counted of seven.
"""

from __future__ import annotations

import re
from typing import NamedTuple

SLICES = 7  # compute slices of a MIG-capable GPU (A100 / H100 / H200 / B200)
MEMORY_SLICES = 8
NEVER = 1 << MEMORY_SLICES  # a slice that does not exist: a mask holding it is never free

_NAME = re.compile(r"^([1-7])g\.(\d{1,3})gb$")


class Instance(NamedTuple):
    """One MIG instance configured on a GPU: its profile and placement."""

    profile: str  # "1g.10gb"
    start: int  # first memory slice
    size: int  # memory slices spanned

    @property
    def mask(self) -> int:
        return ((1 << self.size) - 1) << self.start


class Profile(NamedTuple):
    name: str
    slices: int  # compute slices (the "g")
    size: int  # memory slices
    starts: tuple[int, ...]


def _table(gb_1: int, gb_1x2: int, gb_3: int, gb_7: int) -> dict[str, Profile]:
    """The six profiles of a 7-slice GPU, by their memory in GB (the shapes are fixed)."""
    rows = (Profile(f"1g.{gb_1}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6)),
            Profile(f"1g.{gb_1x2}gb", 1, 2, (0, 2, 4, 6)),
            Profile(f"2g.{gb_1x2}gb", 2, 2, (0, 2, 4)),
            Profile(f"3g.{gb_3}gb", 3, 4, (0, 4)),
            Profile(f"4g.{gb_3}gb", 4, 4, (0,)),
            Profile(f"7g.{gb_7}gb", 7, 8, (0,)))
    return {p.name: p for p in rows}


# GPU model (the platform's name, shared/gpu_models.py) -> its profiles
TABLES: dict[str, dict[str, Profile]] = {
    "A100-40GB": _table(5, 10, 20, 40), "A800-40GB": _table(5, 10, 20, 40),
    "A100-80GB": _table(10, 20, 40, 80), "A800-80GB": _table(10, 20, 40, 80),
    "H100-80GB": _table(10, 20, 40, 80), "H800-80GB": _table(10, 20, 40, 80),
    "H100-94GB": _table(12, 24, 47, 94), "H100-96GB": _table(12, 24, 48, 96),
    "H200-141GB": _table(18, 35, 71, 141), "B200-192GB": _table(23, 45, 90, 180),
}


def slices_of(profile: str) -> int:
    """Compute slices of a profile name (``3g.40gb`` -> 3); 0 for a name not of that form."""
    m = _NAME.match(profile)
    return int(m.group(1)) if m else 0


def models_with(profile: str) -> tuple[str, ...]:
    """The GPU models on which a profile exists."""
    return tuple(model for model, profiles in TABLES.items() if profile in profiles)


def check_profile(profile: str, models: tuple[str, ...] = ()) -> str:
    """The profile, or ValueError naming what is wrong: a malformed name, a profile no
    MIG-capable GPU has, or one none of ``models`` (a job's gpuModel) has."""
    if not _NAME.match(profile):
        raise ValueError(f"MIG profile {profile!r} is not of the form <slices>g.<memory>gb "
                         f"(1g.10gb, 3g.40gb)")
    where = models_with(profile)
    if not where:
        known = sorted({p for t in TABLES.values() for p in t}, key=lambda p: (slices_of(p), len(p), p))
        raise ValueError(f"no MIG-capable GPU has profile {profile!r}: known profiles are "
                         f"{', '.join(known)}")
    if models and not set(models) & set(where):
        raise ValueError(f"MIG profile {profile!r} exists on {', '.join(where)}, not on "
                         f"{', '.join(m for m in models if '-' in m) or ', '.join(models)}")
    return profile


def layout(model: str, profiles: list[str]) -> tuple[Instance, ...]:
    """Instances for a list of profiles on one GPU of ``model``: the first placement, by a
    search over starts, larger profiles first (``3g+2g+1g+1g`` fits only with the 3g at
    slice 4). ValueError if a profile is not the model's or they cannot fit together."""
    table = TABLES.get(model)
    if table is None:
        raise ValueError(f"{model} is not MIG-capable: MIG runs on {', '.join(TABLES)}")
    for name in profiles:
        if name not in table:
            raise ValueError(f"{model} has no MIG profile {name!r}: it has {', '.join(table)}")
    todo = sorted((table[n] for n in profiles), key=lambda p: -p.size)

    def place(k: int, used: int) -> list[Instance] | None:
        if k == len(todo):
            return []
        p = todo[k]
        for start in p.starts:
            inst = Instance(p.name, start, p.size)
            if not used & inst.mask:
                rest = place(k + 1, used | inst.mask)
                if rest is not None:
                    return [inst, *rest]
        return None

    out = place(0, 0)
    if out is None:
        raise ValueError(f"MIG profiles {', '.join(profiles)} do not fit together on one {model}")
    return tuple(sorted(out, key=lambda i: i.start))


def check_geometry(model: str, instances: tuple[Instance, ...]) -> None:
    """ValueError if the instances overlap or one sits where its profile may not (checked
    against the model's table when there is one)."""
    used = 0
    table = TABLES.get(model, {})
    for inst in instances:
        p = table.get(inst.profile)
        if p is not None and (inst.start not in p.starts or inst.size != p.size):
            raise ValueError(f"MIG {inst.profile} cannot sit at memory slice {inst.start} of a {model}")
        if inst.start < 0 or inst.start + inst.size > MEMORY_SLICES or used & inst.mask:
            raise ValueError(f"MIG instances overlap or overrun the GPU: {instances}")
        used |= inst.mask
