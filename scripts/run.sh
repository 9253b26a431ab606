#!/usr/bin/env bash
# Sets up, builds, and runs the main job: inspect the model, then generate a short continuation with the
# default (CED bounded-replay) prefill plan. Without a model directory it first makes the tiny built-in model.
#   scripts/run.sh [MODEL_DIR] [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
model="${1:-}"
prompt="${2:-The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon.}"
if [ -z "$model" ]; then
  model=build/tiny-model
  if [ ! -f "$model/config.json" ]; then
    build/apps/dsflash make-tiny --preset tiny -o "$model" --seed 1 --force --tokenizer "$(scripts/fetch_tokenizer.sh)"
  fi
fi
build/apps/dsflash inspect -m "$model"
echo
echo "generate (greedy, 24 tokens):"
build/apps/dsflash generate -m "$model" -p "$prompt" -n 24 --stats
echo
