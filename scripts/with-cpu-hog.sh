#!/usr/bin/env bash
# Run a command beside a CPU hog (stress-ng's --cpu workers, one per core unless
# KAIROS_HOG_CPUS says otherwise), so that the tests and the chaos suite are tried on a
# loaded machine: `scripts/with-cpu-hog.sh make test`. The hog stops with the command.
set -euo pipefail
command -v stress-ng >/dev/null || { echo "stress-ng is missing: make tools installs it" >&2; exit 2; }
workers="${KAIROS_HOG_CPUS:-$(nproc)}"
stress-ng --cpu "$workers" --quiet &
hog=$!
export KAIROS_CPU_HOG="stress-ng --cpu $workers"  # the benchmarks record it
trap 'kill "$hog" 2>/dev/null || true; wait "$hog" 2>/dev/null || true' EXIT
echo "with-cpu-hog: stress-ng --cpu $workers (pid $hog) beside: $*" >&2
"$@"
