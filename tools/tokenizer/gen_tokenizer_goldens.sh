#!/usr/bin/env bash
# Regenerates tests/data/tokenizer/encode_goldens.json and codepoint_goldens.json with Hugging Face tokenizers inside the chroot made by
# make_unstable_chroot.sh. Usage: gen_tokenizer_goldens.sh CHROOT_DIR [SHARED_DIR]
set -euo pipefail
chroot_dir="${1:?usage: gen_tokenizer_goldens.sh CHROOT_DIR [SHARED_DIR]}"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
shared="${2:-$repo/../shared}"
work="$chroot_dir/tmp/dsflash-tokenizer-goldens"
mkdir -p "$work"
cp "$repo/tools/tokenizer/gen_tokenizer_goldens.py" "$work/"
cp "$shared/tokenizer/deepseek_v3_tokenizer.json" "$shared/tokenizer/deepseek_v41_tokenizer.reconstructed.json" "$work/"
chroot "$chroot_dir" python3 /tmp/dsflash-tokenizer-goldens/gen_tokenizer_goldens.py \
  /tmp/dsflash-tokenizer-goldens/deepseek_v3_tokenizer.json \
  /tmp/dsflash-tokenizer-goldens/deepseek_v41_tokenizer.reconstructed.json \
  /tmp/dsflash-tokenizer-goldens/encode_goldens.json
chroot "$chroot_dir" python3 - < "$repo/tools/tokenizer/gen_codepoint_goldens.py" \
  /tmp/dsflash-tokenizer-goldens/deepseek_v3_tokenizer.json /tmp/dsflash-tokenizer-goldens/codepoint_goldens.json
cp "$work/encode_goldens.json" "$repo/tests/data/tokenizer/encode_goldens.json"
cp "$work/codepoint_goldens.json" "$repo/tests/data/tokenizer/codepoint_goldens.json"
echo "wrote $repo/tests/data/tokenizer/encode_goldens.json ($(wc -c < "$repo/tests/data/tokenizer/encode_goldens.json") bytes)"
