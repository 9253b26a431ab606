#include "prefix/block_record.h"

#include <xxhash.h>

#include <cstring>

namespace dsflash::prefix {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'F', 'K', 'V', 'B', 'L', 'K'};
constexpr size_t kChecksumOffset = 88;

void put_u32(uint8_t* at, uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | at[i];
  return v;
}
uint64_t get_u64(const uint8_t* at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | at[i];
  return v;
}

uint64_t record_checksum(const uint8_t* header, const uint8_t* payload, size_t payload_bytes) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, header, kChecksumOffset);
  XXH3_64bits_update(state, payload, payload_bytes);
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

}  // namespace

std::vector<uint8_t> encode_record(const BlockRecord& record) {
  const size_t token_bytes = record.tokens.size() * 4;
  std::vector<uint8_t> bytes(kRecordHeaderBytes + token_bytes + record.kv.size(), 0);
  uint8_t* h = bytes.data();
  std::memcpy(h, kMagic, 8);
  put_u32(h + 8, kCacheFormatVersion);
  put_u32(h + 12, static_cast<uint32_t>(kRecordHeaderBytes));
  put_u64(h + 16, record.fingerprint.high);
  put_u64(h + 24, record.fingerprint.low);
  put_u64(h + 32, record.block_hash);
  put_u64(h + 40, record.parent_hash);
  put_u64(h + 48, record.block_index);
  put_u32(h + 56, static_cast<uint32_t>(record.tokens.size()));
  put_u64(h + 64, record.kv.size());
  put_u64(h + 72, record.created_unix_s);
  put_u64(h + 80, token_bytes + record.kv.size());
  uint8_t* payload = h + kRecordHeaderBytes;
  for (size_t i = 0; i < record.tokens.size(); ++i) put_u32(payload + 4 * i, static_cast<uint32_t>(record.tokens[i]));
  if (!record.kv.empty()) std::memcpy(payload + token_bytes, record.kv.data(), record.kv.size());
  put_u64(h + kChecksumOffset, record_checksum(h, payload, token_bytes + record.kv.size()));
  return bytes;
}

Result<BlockRecord> decode_record(std::span<const uint8_t> bytes, const RecordExpectation& expect,
                                  const std::string& origin) {
  auto error = [&](size_t offset, const std::string& what) {
    return Status::Error(origin + ": prefix-cache record, offset " + std::to_string(offset) + ": " + what);
  };
  if (bytes.size() < kRecordHeaderBytes) {
    return error(0, std::to_string(bytes.size()) + " bytes, shorter than the " + std::to_string(kRecordHeaderBytes) +
                        "-byte header");
  }
  const uint8_t* h = bytes.data();
  if (std::memcmp(h, kMagic, 8) != 0) return error(0, "bad magic (not a dsflash KV block record)");
  const uint32_t version = get_u32(h + 8);
  if (version != kCacheFormatVersion) {
    return error(8, "format version " + std::to_string(version) + ", this build reads " +
                        std::to_string(kCacheFormatVersion));
  }
  if (get_u32(h + 12) != kRecordHeaderBytes) return error(12, "header_bytes " + std::to_string(get_u32(h + 12)));
  const uint64_t payload_bytes = get_u64(h + 80);
  if (payload_bytes != bytes.size() - kRecordHeaderBytes) {
    return error(80, "payload_bytes " + std::to_string(payload_bytes) + " but the record has " +
                         std::to_string(bytes.size() - kRecordHeaderBytes) + " bytes after the header");
  }
  const uint32_t token_count = get_u32(h + 56);
  const uint64_t kv_bytes = get_u64(h + 64);
  if (get_u32(h + 60) != 0) return error(60, "reserved field is not 0");
  if (kv_bytes > payload_bytes || payload_bytes - kv_bytes != uint64_t{token_count} * 4) {
    return error(56, "token_count " + std::to_string(token_count) + " and kv_bytes " + std::to_string(kv_bytes) +
                         " do not add up to payload_bytes " + std::to_string(payload_bytes));
  }
  const uint8_t* payload = h + kRecordHeaderBytes;
  if (get_u64(h + kChecksumOffset) != record_checksum(h, payload, payload_bytes)) {
    return error(kChecksumOffset, "checksum mismatch (the record is damaged)");
  }
  BlockRecord record;
  record.fingerprint = Fingerprint{get_u64(h + 16), get_u64(h + 24)};
  if (!(record.fingerprint == expect.fingerprint)) {
    return error(16, "written for model " + record.fingerprint.hex() + ", this model is " + expect.fingerprint.hex());
  }
  if (expect.token_count != 0 && token_count != expect.token_count) {
    return error(56, "token_count " + std::to_string(token_count) + ", the cache's block size is " +
                         std::to_string(expect.token_count));
  }
  if (expect.kv_bytes != 0 && kv_bytes != expect.kv_bytes) {
    return error(64, "kv_bytes " + std::to_string(kv_bytes) + ", the model's block holds " +
                         std::to_string(expect.kv_bytes));
  }
  record.block_hash = get_u64(h + 32);
  record.parent_hash = get_u64(h + 40);
  record.block_index = get_u64(h + 48);
  record.created_unix_s = get_u64(h + 72);
  record.tokens.resize(token_count);
  for (uint32_t i = 0; i < token_count; ++i) record.tokens[i] = static_cast<int32_t>(get_u32(payload + 4 * i));
  record.kv.assign(payload + uint64_t{token_count} * 4, payload + payload_bytes);
  return record;
}

}  // namespace dsflash::prefix
