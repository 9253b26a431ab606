// One persisted prefix-cache block (spec/MODEL.md §7: the persistent cache keeps only the global KV). A record
// holds the global KV of every KV source for one 64-token block of one prompt prefix (the kv::KvLayout block bytes,
// main KV and indexer keys in the report's formats) plus the block's token ids, so that a hit is verified token
// for token, not only by its hash. Window rows are never persisted (they are rebuilt by bounded replay), a
// block-aligned block has no pending ratio-2 half-group, and Engram history comes from the token ids.
//
// Layout (little-endian), header 96 bytes then the payload:
//   0  magic "DSFKVBLK"          8   format_version u32       12  header_bytes u32 (96)
//   16 model fingerprint [16]    32  block_hash u64           40  parent_hash u64 (0 for a prompt's first block)
//   48 block_index u64           56  token_count u32          60  reserved u32 (0)
//   64 kv_bytes u64              72  created_unix_s u64       80  payload_bytes u64 (= 4 * token_count + kv_bytes)
//   88 checksum u64: xxh3-64 of header bytes [0, 88) followed by the payload
//   96 payload: token ids [token_count] i32, then the block's KV bytes [kv_bytes]
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "prefix/fingerprint.h"

namespace dsflash::prefix {

inline constexpr size_t kRecordHeaderBytes = 96;

struct BlockRecord {
  Fingerprint fingerprint;
  uint64_t block_hash = 0;
  uint64_t parent_hash = 0;
  uint64_t block_index = 0;      // the block's position in its prefix: positions [index * tokens, + tokens)
  uint64_t created_unix_s = 0;
  std::vector<int32_t> tokens;   // [token_count]
  std::vector<uint8_t> kv;       // [kv_bytes] the kv::KvLayout block: every source's main entries then keys
};

// The record's bytes (header + payload).
std::vector<uint8_t> encode_record(const BlockRecord& record);

// What a reader expects of a record; every mismatch is an error naming the field and the offset.
struct RecordExpectation {
  Fingerprint fingerprint;
  uint64_t kv_bytes = 0;       // the model's block bytes (0: any, for `dsflash cache verify`)
  uint32_t token_count = 0;    // the block size in tokens (0: any)
};

// Parses and verifies bytes (magic, version, sizes, checksum, fingerprint, block size). `origin` names the source
// (a file) in errors. Never reads outside `bytes`.
Result<BlockRecord> decode_record(std::span<const uint8_t> bytes, const RecordExpectation& expect,
                                  const std::string& origin);

}  // namespace dsflash::prefix
