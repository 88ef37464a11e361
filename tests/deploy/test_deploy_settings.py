"""docs/deploy.md's Configuration section lists every setting the services read: every
field of every pydantic-settings class under services/ and shared/, as KAIROS_<FIELD>."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from pydantic_settings import BaseSettings

from .conftest import ROOT

DEPLOY_MD = ROOT / "docs" / "deploy.md"
SETTINGS_BASES = {"BaseSettings", "CommonSettings"}


def settings_classes() -> dict[str, type[BaseSettings]]:
    """Every class that subclasses BaseSettings or CommonSettings by name, found in the
    source of services/ and shared/, imported."""
    found: dict[str, type[BaseSettings]] = {}
    for path in sorted([*(ROOT / "services").rglob("*.py"), *(ROOT / "shared").rglob("*.py")]):
        tree = ast.parse(path.read_text(), str(path))
        names = [
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            and any(isinstance(b, ast.Name) and b.id in SETTINGS_BASES for b in node.bases)
        ]
        if names:
            module = importlib.import_module(
                ".".join(path.relative_to(ROOT).with_suffix("").parts)
            )
            for name in names:
                found[f"{module.__name__}.{name}"] = getattr(module, name)
    return found


def configuration_section() -> str:
    text = DEPLOY_MD.read_text()
    return text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]


def test_every_setting_is_documented() -> None:
    classes = settings_classes()
    # the five services and the shared base, at least
    assert {c.rsplit(".", 1)[1] for c in classes} >= {
        "CommonSettings", "AdmissionSettings", "QueueingSettings", "SchedulerSettings",
        "MonitorSettings", "AgentSettings",
    }
    section = configuration_section()
    missing = []
    for where, cls in classes.items():
        prefix = cls.model_config.get("env_prefix", "")
        assert prefix == "KAIROS_", where
        for field in cls.model_fields:
            var = f"{prefix}{field.upper()}"
            if f"`{var}`" not in section:
                missing.append(f"{var} ({where})")
    assert not missing, "docs/deploy.md#configuration does not list: " + ", ".join(missing)


def test_the_check_sees_a_missing_setting() -> None:
    """The section is really what is searched: a made-up variable is not in it."""
    section = configuration_section()
    assert "`KAIROS_NODE_ADDRESS`" in section
    assert "`KAIROS_NO_SUCH_SETTING`" not in section
    assert Path(DEPLOY_MD).is_file()
