#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs every test: CTest; the server suite (`node --test` with the openai and
# @anthropic-ai/sdk clients from tests/server/package-lock.json, installed with npm ci) against `dsflash serve` on
# a fresh tiny model; then the CTest tests again built with ASan + UBSan (scripts/test_sanitize.sh, build-asan/).
# This is what CI runs; any failure fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"

tokenizer=$(scripts/fetch_tokenizer.sh)
model_dir=$(mktemp -d)
trap 'rm -rf "$model_dir"' EXIT
build/apps/dsflash make-tiny --preset tiny -o "$model_dir/tiny" --tokenizer "$tokenizer" >/dev/null
(cd tests/server && npm ci --no-audit --no-fund --loglevel=error)
(cd tests/server && DSFLASH_BIN="$PWD/../../build/apps/dsflash" DSFLASH_TINY_MODEL="$model_dir/tiny" \
  node --test --test-reporter=spec)

scripts/test_sanitize.sh
