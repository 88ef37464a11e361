"""GPU models by name: what an agent reports, what a job asks for, and how they meet.

Agents report the product name NVML gives (``NVIDIA H100 80GB HBM3``, ``NVIDIA
A100-SXM4-40GB``, ``Tesla V100-SXM2-32GB``, ``Tesla K80``) and each GPU's memory. The
platform names a model by its family and memory, ``H100-80GB``: the family from the
product name, the memory snapped to the family's sizes (NVML reports a little less than
the box says, 81,559 MiB for 80 GB). A job's ``gpuModel`` takes, case-insensitively:

- a family, ``H100``: any memory size of it;
- a family and size, ``A100-80GB`` (``A100-80G``, ``a100 80gb``);
- a product name as an agent reports it, ``NVIDIA A100-SXM4-80GB``.

A name of no known family is refused with the list of known ones: a typo must not make
a job wait for hardware that does not exist. A node with a GPU of another family is
named by its product name and is still reached through ``nodeSelector`` on its
``kairos.io/gpu-model`` label.
"""

from __future__ import annotations

import functools
import re

# family -> memory sizes (GB) it ships with; newest first within each generation
FAMILIES: dict[str, tuple[int, ...]] = {
    "B200": (192,), "GB200": (192,), "H200": (141,), "GH200": (96, 144), "H100": (80, 94, 96),
    "H800": (80,), "H20": (96,), "L40S": (48,), "L40": (48,), "L4": (24,), "A100": (40, 80),
    "A800": (40, 80), "A40": (48,), "A30": (24,), "A10G": (24,), "A10": (24,), "A16": (16,),
    "A2": (16,), "V100": (16, 32), "T4": (16,), "P100": (12, 16), "P40": (24,), "P4": (8,),
    "K80": (12,),
}
# CUDA compute capability by family (what a simulated GPU reports)
COMPUTE_CAPABILITY = {
    "B200": "10.0", "GB200": "10.0", "H200": "9.0", "GH200": "9.0", "H100": "9.0",
    "H800": "9.0", "H20": "9.0", "L40S": "8.9", "L40": "8.9", "L4": "8.9", "A100": "8.0",
    "A800": "8.0", "A30": "8.0", "A40": "8.6", "A10G": "8.6", "A10": "8.6", "A16": "8.6",
    "A2": "8.6", "V100": "7.0", "T4": "7.5", "P100": "6.0", "P40": "6.1", "P4": "6.1",
    "K80": "3.7",
}
_FAMILY = re.compile(r"(?<![A-Z0-9])(" + "|".join(sorted(FAMILIES, key=len, reverse=True))
                     + r")(?![A-Z0-9])")
_SIZE = re.compile(r"(\d+)\s*G(?:B|IB)?(?![A-Z0-9])")
LABEL = "kairos.io/gpu-model"  # the node label holding its GPUs' model name


def _snap(family: str, gb: float) -> int:
    """The family's size nearest to ``gb`` (by ratio)."""
    return min(FAMILIES[family], key=lambda size: abs(size / max(gb, 0.1) - 1))


def _parse(name: str) -> tuple[str | None, int | None]:
    upper = name.upper().replace("_", "-")
    family = _FAMILY.search(upper)
    if family is None:
        return None, None
    size = _SIZE.search(upper, family.end())
    return family.group(1), None if size is None else int(size.group(1))


@functools.lru_cache(maxsize=1024)  # per GPU of every node, each time the nodes change
def model_id(product: str, memory_mib: int = 0) -> str:
    """The platform's name for a GPU an agent reports: ``H100-80GB``; for a family it does
    not know, the product name made a valid label value (``NVIDIA-GeForce-RTX-4090``)."""
    family, gb = _parse(product)
    if family is None:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", product).strip("-._")[:63] or "unknown"
    if gb is None and memory_mib:
        gb = round(memory_mib / 1024)
    return f"{family}-{_snap(family, gb)}GB" if gb else family


def compute_capability(product: str) -> str:
    """The family's CUDA compute capability ("" for a family not known)."""
    family, _ = _parse(product)
    return COMPUTE_CAPABILITY.get(family or "", "")


def node_labels(model: str) -> dict[str, str]:
    """The labels a node's GPU model gives it: its name, and for a known family the
    family and memory apart (``nodeSelector: {kairos.io/gpu-family: A100}``)."""
    labels = {LABEL: model}
    family, _, memory = model.partition("-")
    if family in FAMILIES and memory:
        labels |= {"kairos.io/gpu-family": family, "kairos.io/gpu-memory": memory}
    return labels


def reported_memory_mib(name: str) -> int:
    """The memory NVML reports for a model (a simulated GPU's): a little under the box's
    size, as 81,559 MiB for 80 GB; the family's smallest size where none is named."""
    family, gb = _parse(name)
    if family is None:
        raise ValueError(f"unknown GPU model {name!r}")
    return int((gb or FAMILIES[family][0]) * 1019.5)


@functools.lru_cache(maxsize=1024)  # per job, each time its request is made
def expand(requested: str) -> tuple[str, ...]:
    """The model names a request matches. Raises ValueError for an unknown family or a
    size the family never had."""
    family, gb = _parse(requested)
    if family is None:
        raise ValueError(f"unknown GPU model {requested!r}: a family of "
                         f"{', '.join(FAMILIES)}, optionally with its memory (A100-80GB)")
    sizes = FAMILIES[family]
    if gb is None:
        return (*(f"{family}-{s}GB" for s in sizes), family)
    if gb not in sizes:
        raise ValueError(f"no {family} has {gb} GB: {family} comes with "
                         f"{', '.join(f'{s} GB' for s in sizes)}")
    return (f"{family}-{gb}GB",)


def expand_all(requested: list[str]) -> tuple[str, ...]:
    """Every model a list of requests matches, in the order asked, each once."""
    out: dict[str, None] = {}
    for name in requested:
        out.update(dict.fromkeys(expand(name)))
    return tuple(out)
