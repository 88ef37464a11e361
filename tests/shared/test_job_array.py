"""Job array syntax, as Slurm's --array: what each form expands to, and refusals that
say what is wrong."""

from __future__ import annotations

import pytest

from shared.job_array import MAX_INDEX, element_env, element_id, is_array_id, parse_array


@pytest.mark.parametrize(("text", "indices", "cap"), [
    ("0-3", (0, 1, 2, 3), None),
    ("7", (7,), None),
    ("1,3,5-7", (1, 3, 5, 6, 7), None),
    ("0-15:4", (0, 4, 8, 12), None),
    ("0-999%50", tuple(range(1000)), 50),
    (" 3,1,2-3 ", (1, 2, 3), None),  # repeats count once, in order
])
def test_forms(text: str, indices: tuple[int, ...], cap: int | None) -> None:
    arr = parse_array(text)
    assert (arr.indices, arr.max_running, arr.size) == (indices, cap, len(indices))


@pytest.mark.parametrize(("text", "says"), [
    ("", "no indices"), ("%4", "no indices"), ("3-1", "a range goes up"),
    ("0-9:0", "the step must be at least 1"), ("0-9%0", "at least 1"),
    ("0-9%x", "whole number"), ("a-b", "not an index or a range"), ("-1", "not an index"),
    (f"0-{MAX_INDEX + 1}", "indices go up to"),
])
def test_refusals_say_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_array(text)


def test_the_element_count_is_bounded_before_anything_is_expanded() -> None:
    with pytest.raises(ValueError, match="at most 10 elements"):
        parse_array("0-5,10-20", max_elements=10)


def test_ids_and_environment() -> None:
    arr = parse_array("2-8:3")
    assert element_id("a-12ab", 5) == "a-12ab-5"
    assert is_array_id("a-12ab") and not is_array_id("a-12ab-5") and not is_array_id("j-1")
    assert element_env("a-12ab", 5, arr) == {
        "KAIROS_ARRAY_ID": "a-12ab", "KAIROS_ARRAY_INDEX": "5", "SLURM_ARRAY_JOB_ID": "a-12ab",
        "SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "2",
        "SLURM_ARRAY_TASK_MAX": "8"}
