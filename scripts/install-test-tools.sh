#!/usr/bin/env bash
# System tools the tests use, installed once on a fresh Debian machine (idempotent):
# kcat (reads topics as plain JSON in the end-to-end test), iproute2 (the chaos suite's
# network partition), stress-ng (the CPU hog of `make test-loaded` and `make chaos-loaded`).
set -euo pipefail
need=()
command -v kcat >/dev/null || need+=(kcat)
command -v ip >/dev/null || need+=(iproute2)
command -v stress-ng >/dev/null || need+=(stress-ng)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ -x scripts/install-deploy-tools.sh ]; then
  scripts/install-deploy-tools.sh
fi
