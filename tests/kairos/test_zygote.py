"""Services forked from the zygote (kairos/zygote.py) behave as processes of their own:
their environment, log, exit code (a signal's as Popen gives it), process group; and
the zygote preloads nothing a service would not import itself, so each service's module
state (its metric registry above all) is what it would be without the zygote."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kairos.stack import MODULES, SERVICES
from kairos.zygote import PRELOAD, Zygote, ZygoteStale

CHILD = "tests.kairos.zygote_child"


@pytest.fixture
def zygote(tmp_path: Path):  # type: ignore[no-untyped-def]
    z = Zygote(tmp_path / "zygote.log")
    yield z
    z.close()


def env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.getcwd(), **extra}


def test_a_forked_child_has_its_env_log_and_exit_code(zygote: Zygote, tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = zygote.spawn(CHILD, env(ZYGOTE_TEST="hello", ZYGOTE_EXIT="3"), log)
    assert child.wait(30) == 3 and child.poll() == 3
    # argv[0] the module's file, as `python -m` sets it
    assert "env=hello argv0=" + str(Path(__file__).with_name("zygote_child.py")) \
        + " pgid_is_pid=True" in log.read_text()
    assert "ZYGOTE_TEST" not in os.environ  # the caller's own is untouched


def test_a_killed_child_reads_as_popen_says_and_an_error_is_logged(
        zygote: Zygote, tmp_path: Path) -> None:
    sleeper = zygote.spawn(CHILD, env(ZYGOTE_SLEEP="1"), tmp_path / "sleeper.log")
    assert sleeper.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(0.2)
    os.kill(sleeper.pid, signal.SIGKILL)
    assert sleeper.wait(30) == -signal.SIGKILL
    failing = zygote.spawn(CHILD, env(ZYGOTE_RAISE="1"), tmp_path / "failing.log")
    assert failing.wait(30) == 1
    assert "RuntimeError: boom from the child" in (tmp_path / "failing.log").read_text()
    # and the zygote still forks after both
    assert zygote.spawn(CHILD, env(), tmp_path / "again.log").wait(30) == 0


def test_a_child_has_its_own_group_and_name_and_the_zygote_ends_on_close(
        tmp_path: Path) -> None:
    z = Zygote(tmp_path / "zygote.log")
    child = z.spawn(CHILD, env(ZYGOTE_SLEEP="1", KAIROS_SERVICE_NAME="probe"),
                    tmp_path / "c.log")
    assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    deadline = time.monotonic() + 30
    log = tmp_path / "c.log"  # the child makes it
    while not (log.exists() and "env=" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)  # it runs its module (the title is set before)
    # ps shows the service (setproctitle comes with the embedded extras)
    title = Path(f"/proc/{child.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "kairos probe" in title, title
    child.kill()
    assert child.wait(30) == -signal.SIGKILL
    z.close()
    assert not z.alive


def test_the_preload_is_only_what_every_service_imports() -> None:
    """Were it more, a service forked from the zygote would hold another service's
    modules: their metrics in its /metrics, their state in its memory."""
    def modules(code: str) -> set[str]:
        out = subprocess.run([sys.executable, "-c", code + "; print(' '.join(sys.modules))"],
                             capture_output=True, text=True, check=True, timeout=120)
        return set(out.stdout.split())

    preloaded = modules("import sys, importlib; [importlib.import_module(m) for m in "
                        f"{list(PRELOAD)!r}]")
    for name in (*SERVICES, "node_agent"):
        package = MODULES.get(name, f"services.{name}")
        main = f"{package}.service" if name == "forecaster" else f"{package}.main"
        extra = preloaded - modules(f"import sys, {main}")
        assert not extra, f"{name} never imports {sorted(extra)[:10]}"


def test_a_zygote_of_code_since_edited_forks_nothing(zygote: Zygote, tmp_path: Path) -> None:
    """A restarted service must not get the old preloaded modules beside new ones it
    imports itself: the zygote says it is stale, and the stack starts a new one."""
    import shared.jobspec

    path = Path(shared.jobspec.__file__)
    st = path.stat()
    assert zygote.spawn(CHILD, env(), tmp_path / "a.log").wait(30) == 0  # preloaded
    try:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        with pytest.raises(ZygoteStale):
            zygote.spawn(CHILD, env(), tmp_path / "b.log")
    finally:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert zygote.spawn(CHILD, env(), tmp_path / "c.log").wait(30) == 0
