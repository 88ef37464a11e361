"""The README's job-spec section is the table generated from the model: every field of
the job, its tasks and their resources, with a type, default and description."""

from __future__ import annotations

from pathlib import Path

import pytest

from kairos import spec_doc
from shared.jobspec import JobSpec, Resources, TaskSpec


def test_the_readme_section_is_the_generated_table() -> None:
    current = spec_doc.section(spec_doc.README.read_text())
    assert current is not None, f"README.md lost its markers {spec_doc.BEGIN!r} .. {spec_doc.END!r}"
    assert current == spec_doc.render(), (
        f"README.md's job-spec table is out of date: run `{spec_doc.REGENERATE}`")


def test_every_field_is_documented() -> None:
    paths = [p for p, _, _, _ in spec_doc.rows()]
    expected = [f.alias or n for n, f in JobSpec.model_fields.items()] + \
        [f"tasks[].{f.alias or n}" for n, f in TaskSpec.model_fields.items()] + \
        [f"tasks[].resources.{f.alias or n}" for n, f in Resources.model_fields.items()]
    assert paths == expected
    table = {p: (t, d, text) for p, t, d, text in spec_doc.rows()}
    assert table["priorityClass"][:2] == ("low \\| normal \\| high \\| urgent", "`normal`")
    assert table["preemptible"][:2] == ("bool", "`true`")
    assert table["tasks[].resources.gpu"] == ("int, 0 to 64", "`0`", "whole GPUs per replica")
    assert table["name"][1] == "**required**" and table["minAvailable"][1] == "unset"
    assert all(text for _, _, text in table.values())


def test_write_replaces_only_the_section(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# before\n\n{spec_doc.BEGIN}\nold\n{spec_doc.END}\n\nafter\n")
    assert spec_doc.write(readme)
    text = readme.read_text()
    assert text.startswith("# before\n\n") and text.endswith("\n\nafter\n")
    assert spec_doc.section(text) == spec_doc.render()
    assert not spec_doc.write(readme)  # already current


def test_a_field_without_a_description_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.jobspec import JobSpec
    monkeypatch.setattr(JobSpec.model_fields["preemptible"], "description", None)
    with pytest.raises(LookupError, match="preemptible"):
        spec_doc.rows()
