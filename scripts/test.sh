#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs every test (CTest), then the same tests again built with ASan + UBSan
# (scripts/test_sanitize.sh, build-asan/). This is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
scripts/test_sanitize.sh
