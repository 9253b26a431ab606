// libFuzzer target: the prefix-cache record parser (src/prefix/block_record.h) on arbitrary bytes.
// Invariants: never crashes or reads outside the input; a record that decodes re-encodes to exactly the input
// (the format has one encoding), with both "any" and exact expectations.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "prefix/block_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsflash::prefix;
  const std::span<const uint8_t> bytes(data, size);
  // The fingerprint the seeds carry (fuzz/run_fuzzers.sh writes them); mutations reach the other branches.
  const RecordExpectation any{Fingerprint{1, 2}, 0, 0};
  auto record = decode_record(bytes, any, "fuzz");
  if (!record.ok()) return 0;
  const auto again = encode_record(*record);
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  const RecordExpectation exact{record->fingerprint, record->kv.size(), static_cast<uint32_t>(record->tokens.size())};
  if (!decode_record(bytes, exact, "fuzz").ok()) std::abort();
  return 0;
}
