#!/usr/bin/env bash
# Sets up, builds, and runs the main job. Without a model directory it makes the tiny built-in model first.
#   scripts/run.sh [MODEL_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
model="${1:-}"
if [ -z "$model" ]; then
  model=build/tiny-model
  [ -f "$model/config.json" ] || build/apps/dsflash make-tiny --preset tiny -o "$model" --seed 1 --force
fi
build/apps/dsflash inspect -m "$model"
