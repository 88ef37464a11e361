#!/usr/bin/env bash
# System tools the tests use, installed once on a fresh Debian machine (idempotent):
# kcat (reads topics as plain JSON in the end-to-end test).
set -euo pipefail
need=()
command -v kcat >/dev/null || need+=(kcat)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ -x scripts/install-deploy-tools.sh ]; then
  scripts/install-deploy-tools.sh
fi
