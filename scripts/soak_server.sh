#!/usr/bin/env bash
# Bounded soak of `dsflash serve` on loopback (not in CI): a fresh tiny model, STREAMS (64) concurrent streams for
# SECONDS (120), 0 errors and every stream finished, server RSS reported. Usage:
#   scripts/soak_server.sh [STREAMS] [SECONDS] [DSFLASH_BINARY]    (e.g. an ASan build's binary)
set -euo pipefail
cd "$(dirname "$0")/.."
streams="${1:-64}"
seconds="${2:-120}"
bin="${3:-build/apps/dsflash}"
tokenizer=$(scripts/fetch_tokenizer.sh)
work=$(mktemp -d)
"$bin" make-tiny --preset tiny -o "$work/tiny" --tokenizer "$tokenizer" >/dev/null
(cd tests/server && [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error)
"$bin" serve -m "$work/tiny" --port 0 --served-name tiny-test --max-queue 128 --max-batch 16 >"$work/out" 2>"$work/err" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 300); do grep -q "listening on" "$work/out" && break; sleep 0.1; done
url=$(grep -o 'http://[^ ]*' "$work/out")
for _ in $(seq 300); do curl -sf "$url/health" >/dev/null && break; sleep 0.1; done
rc=0
node tests/server/soak.mjs "$url" "$pid" "$streams" "$seconds" || rc=1
kill -TERM $pid
wait $pid || rc=1
echo "server exit after SIGTERM: ok ($rc)"
tail -n 3 "$work/err"
exit $rc
