#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs every test (CTest). This is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
