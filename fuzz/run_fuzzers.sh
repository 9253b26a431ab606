#!/usr/bin/env bash
# Builds the libFuzzer targets (clang++ -fsanitize=fuzzer,address; not part of the CMake build or CI) and runs
# each for SECONDS (default 600) in parallel. Usage: fuzz/run_fuzzers.sh [SECONDS] [OUT_DIR]
# Corpora and crash files go under OUT_DIR (default build-fuzz/); logs in OUT_DIR/<target>.log.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-600}"
out="${2:-$repo/build-fuzz}"
mkdir -p "$out"
srcs=$(ls "$repo"/src/tokenizer/*.cpp)
flags="-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$repo/src"
libs="-lpcre2-8 -lutf8proc"
for target in fuzz_tokenizer fuzz_output_parser; do
  clang++ $flags "$repo/fuzz/$target.cpp" $srcs $libs -o "$out/$target"
done
clang++ $flags "$repo/fuzz/fuzz_block_record.cpp" "$repo/src/prefix/block_record.cpp" "$repo/src/prefix/fingerprint.cpp" \
  "$repo"/src/io/*.cpp "$repo"/src/formats/*.cpp "$repo"/src/core/*.cpp -lxxhash -o "$out/fuzz_block_record"
clang++ $flags -I"$repo/include" "$repo/fuzz/fuzz_server_requests.cpp" "$repo/src/server/json_fields.cpp" \
  "$repo/src/server/api_error.cpp" "$repo/src/server/chat_request.cpp" "$repo/src/server/openai_request.cpp" \
  "$repo/src/server/anthropic_request.cpp" $srcs $libs -o "$out/fuzz_server_requests"
export DSFLASH_FUZZ_TOKENIZER="${DSFLASH_FUZZ_TOKENIZER:-$repo/../shared/tokenizer/deepseek_v41_tokenizer.reconstructed.json}"
mkdir -p "$out/corpus_tokenizer" "$out/corpus_output_parser" "$out/corpus_block_record" "$out/corpus_server_requests"
# Request seeds: one small valid body per parser (selector byte first).
printf '\x00{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"stream":true}' > "$out/corpus_server_requests/seed_chat"
printf '\x01{"model":"m","prompt":"hi","max_tokens":3,"stop":["x"]}' > "$out/corpus_server_requests/seed_completion"
printf '\x02{"model":"c","max_tokens":5,"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"tool_use","id":"a","name":"f","input":{"x":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"ok"}]}]}' > "$out/corpus_server_requests/seed_messages"
# Seeds: the committed test texts.
python3 - "$repo" "$out" <<'PY'
import json, sys, os
repo, out = sys.argv[1:3]
g = json.load(open(os.path.join(repo, "tests/data/tokenizer/encode_goldens.json")))
for i, c in enumerate(g["cases"][:200]):
    data = bytes.fromhex(c["hex"]) if "hex" in c else c["text"].encode()
    open(os.path.join(out, "corpus_tokenizer", f"seed_{i}"), "wb").write(data)
ch = json.load(open(os.path.join(repo, "tests/data/tokenizer/chat_goldens.json")))
for i, p in enumerate(ch["parses"]):
    open(os.path.join(out, "corpus_output_parser", f"seed_{i}"), "wb").write(bytes([1 if p["thinking"] else 0]) + p["text"].encode())
PY
# A valid record seed (fingerprint {1, 2}, 4 tokens, 16 KV bytes) in the layout the parser documents; needs
# Debian python3-xxhash (apt-get install python3-xxhash), else the record fuzzer starts from an empty corpus.
/usr/bin/python3 - "$out" <<'PY' || true
import struct, sys, os
try:
    import xxhash
except ImportError:
    sys.exit(0)
out = sys.argv[1]
tokens, kv = [5, 6, 7, 8], bytes(range(16))
payload = b"".join(struct.pack("<i", t) for t in tokens) + kv
head = b"DSFKVBLK" + struct.pack("<IIQQQQQIIQQQ", 1, 96, 1, 2, 0x1111, 0x2222, 3, len(tokens), 0, len(kv), 1700000000, len(payload))
sum_ = xxhash.xxh3_64(head + payload).intdigest()
open(os.path.join(out, "corpus_block_record", "seed_0"), "wb").write(head + struct.pack("<Q", sum_) + payload)
PY
"$out/fuzz_tokenizer" -max_total_time="$seconds" -max_len=4096 -artifact_prefix="$out/crash_tokenizer_" \
  "$out/corpus_tokenizer" > "$out/fuzz_tokenizer.log" 2>&1 &
p1=$!
"$out/fuzz_output_parser" -max_total_time="$seconds" -max_len=4096 -artifact_prefix="$out/crash_output_parser_" \
  -dict="$repo/fuzz/dsml.dict" "$out/corpus_output_parser" > "$out/fuzz_output_parser.log" 2>&1 &
p2=$!
"$out/fuzz_block_record" -max_total_time="$seconds" -max_len=70000 -artifact_prefix="$out/crash_block_record_" \
  "$out/corpus_block_record" > "$out/fuzz_block_record.log" 2>&1 &
p3=$!
"$out/fuzz_server_requests" -max_total_time="$seconds" -max_len=8192 -artifact_prefix="$out/crash_server_requests_" \
  "$out/corpus_server_requests" > "$out/fuzz_server_requests.log" 2>&1 &
p4=$!
rc=0
wait $p4 || rc=1
wait $p1 || rc=1
wait $p2 || rc=1
wait $p3 || rc=1
tail -n 3 "$out/fuzz_tokenizer.log" "$out/fuzz_output_parser.log" "$out/fuzz_block_record.log" "$out/fuzz_server_requests.log"
exit $rc
