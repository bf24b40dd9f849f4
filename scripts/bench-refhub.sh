#!/usr/bin/env bash
# Every refhub benchmark of docs/benchmarks.md ("refhub" section), in one go. The shaped-link ones
# (burst, failover) need root for network namespaces; `make bench-deps` installs the peers (torch for
# gloo, ray). Usage: scripts/bench-refhub.sh [--quick] [OUTDIR]
#   full: ~25 minutes on a quiet 2-core machine (burst with Ray is most of it); --quick: ~5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=""
if [ "${1:-}" = "--quick" ]; then QUICK="--quick"; shift; fi
OUT=${1:-$(mktemp -d "${TMPDIR:-/tmp}/refhub-bench.XXXXXX")}  # private to this run unless given
mkdir -p "$OUT"
R=".venv/bin/refhub bench"
$R dataplane --json $QUICK                       > "$OUT/dataplane-shm.json"
$R dataplane --json $QUICK --transport tcp --repeat 9 > "$OUT/dataplane-tcp.json"
$R server-sweep --json $QUICK                    > "$OUT/server.json"
if [ "$(id -u)" = 0 ]; then
  $R burst --json $QUICK                         > "$OUT/burst.json"
  $R failover --json $QUICK                      > "$OUT/failover.json"
else
  echo "not root: burst and failover (network namespaces) skipped" >&2
fi
echo "results in $OUT"
