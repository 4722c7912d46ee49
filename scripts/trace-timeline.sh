#!/usr/bin/env bash
# The README's timeline (docs/timeline.svg): Jacobi 2048^2 per row on 2x1
# nodes, with 1 and with 4 pools per processor, traced (HYFI_TRACE) and
# drawn by scripts/trace-svg.py; its first four sweeps.
#
#   scripts/trace-timeline.sh [OUT.svg]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/docs/timeline.svg}
cargo build --release --example jacobi --manifest-path "$ROOT/Cargo.toml"
EX=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/jacobi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for p in 1 4; do
  HYFI_TRACE=$TMP/pools$p.json "$EX" --n 2048 --iters 8 --eps 0 --per-row \
    --nodes 2 --procs 1 --pools-per-proc $p
done
python3 "$ROOT/scripts/trace-svg.py" "$OUT" --first 0 --phases 4 \
  "Jacobi 2048² per row, 2×1 nodes, 1 pool per processor=$TMP/pools1.json" \
  "the same, 4 pools per processor=$TMP/pools4.json"
echo "wrote $OUT"
