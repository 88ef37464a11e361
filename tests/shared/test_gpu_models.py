"""GPU model names: what agents report meets what jobs ask for (shared/gpu_models.py)."""

from __future__ import annotations

import pytest

from shared.gpu_models import (
    FAMILIES,
    expand,
    expand_all,
    model_id,
    node_labels,
    reported_memory_mib,
)


@pytest.mark.parametrize(("product", "memory_mib", "name"), [
    ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
    ("NVIDIA H100 PCIe", 81559, "H100-80GB"),  # no size in the name: from the memory
    ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
    ("Tesla V100-SXM2-32GB", 32768, "V100-32GB"),
    ("Tesla V100-PCIE-16GB", 16160, "V100-16GB"),
    ("Tesla K80", 11441, "K80-12GB"),  # NVML reports less than the box: snapped
    ("NVIDIA L40S", 46068, "L40S-48GB"),  # not L4
    ("NVIDIA L4", 23034, "L4-24GB"),
    ("NVIDIA A10G", 23028, "A10G-24GB"),  # not A10
    ("NVIDIA GeForce RTX 4090", 24564, "NVIDIA-GeForce-RTX-4090"),  # unknown: a label value
])
def test_a_reported_gpu_is_named_by_family_and_memory(product: str, memory_mib: int,
                                                      name: str) -> None:
    assert model_id(product, memory_mib) == name


def test_a_request_matches_a_family_a_size_or_a_product_name() -> None:
    assert expand("H100") == ("H100-80GB", "H100-94GB", "H100-96GB", "H100")
    assert expand("a100-80gb") == expand("A100 80G") == expand("NVIDIA A100-SXM4-80GB") \
        == ("A100-80GB",)
    # every model a node can be named is matched by its own family's request
    for family, sizes in FAMILIES.items():
        for gb in sizes:
            assert model_id(family, reported_memory_mib(f"{family}-{gb}GB")) in expand(family)
    assert expand_all(["V100", "V100-32GB", "K80"]) == (
        "V100-16GB", "V100-32GB", "V100", "K80-12GB", "K80")


@pytest.mark.parametrize(("request_", "says"), [
    ("H1000", "unknown GPU model 'H1000'"), ("rtx", "unknown GPU model"),
    ("A100-64GB", "no A100 has 64 GB: A100 comes with 40 GB, 80 GB"),
])
def test_a_model_no_gpu_has_is_refused_naming_why(request_: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        expand(request_)


def test_a_node_is_labelled_by_its_model_family_and_memory() -> None:
    assert node_labels("A100-80GB") == {"kairos.io/gpu-model": "A100-80GB",
                                        "kairos.io/gpu-family": "A100",
                                        "kairos.io/gpu-memory": "80GB"}
    assert node_labels("NVIDIA-GeForce-RTX-4090") == {
        "kairos.io/gpu-model": "NVIDIA-GeForce-RTX-4090"}
