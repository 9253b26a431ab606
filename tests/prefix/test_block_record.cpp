// Block records: round trips, and every kind of damage is an error that names the offset.
#include <gtest/gtest.h>

#include <random>

#include "prefix_test_util.h"

namespace dsflash::testing {
namespace {

using prefix::decode_record;
using prefix::encode_record;
using prefix::kRecordHeaderBytes;

TEST(BlockRecord, RoundTripsEveryField) {
  const auto record = test_record(42);
  const auto bytes = encode_record(record);
  EXPECT_EQ(bytes.size(), kRecordHeaderBytes + 64 * 4 + 512);
  auto back = decode_record(bytes, test_expectation(), "mem");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(same_record(*back, record));
  EXPECT_EQ(back->created_unix_s, record.created_unix_s);
}

TEST(BlockRecord, EveryFlippedHeaderByteAndSampledPayloadByteIsRejected) {
  const auto bytes = encode_record(test_record(7));
  std::vector<size_t> offsets;
  for (size_t i = 0; i < kRecordHeaderBytes; ++i) offsets.push_back(i);
  std::mt19937 rng(3);
  for (int i = 0; i < 300; ++i) offsets.push_back(kRecordHeaderBytes + rng() % (bytes.size() - kRecordHeaderBytes));
  for (size_t at : offsets) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      auto damaged = bytes;
      damaged[at] ^= mask;
      EXPECT_FALSE(decode_record(damaged, test_expectation(), "mem").ok()) << "byte " << at << " mask " << int(mask);
    }
  }
}

TEST(BlockRecord, TruncatedZeroLengthAndOverlongAreRejected) {
  const auto bytes = encode_record(test_record(9));
  for (size_t length : {size_t{0}, size_t{1}, size_t{8}, kRecordHeaderBytes - 1, kRecordHeaderBytes,
                        kRecordHeaderBytes + 100, bytes.size() - 1}) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(length));
    auto r = decode_record(cut, test_expectation(), "file.kvb");
    ASSERT_FALSE(r.ok()) << length;
    EXPECT_NE(r.status().message().find("file.kvb"), std::string::npos);
  }
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(decode_record(longer, test_expectation(), "mem").ok());
}

TEST(BlockRecord, AnotherModelOrLayoutNeverDecodes) {
  const auto bytes = encode_record(test_record(11));
  auto other_model = test_expectation();
  other_model.fingerprint = test_fingerprint(2);
  auto r = decode_record(bytes, other_model, "mem");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("offset 16"), std::string::npos) << r.status().message();
  EXPECT_FALSE(decode_record(bytes, test_expectation(513), "mem").ok());
  EXPECT_FALSE(decode_record(bytes, test_expectation(512, 32), "mem").ok());
  // 0 = any (dsflash cache verify)
  EXPECT_TRUE(decode_record(bytes, test_expectation(0, 0), "mem").ok());
}

TEST(BlockRecord, ForeignBytesAreRejected) {
  std::vector<uint8_t> text(200, 'x');
  EXPECT_FALSE(decode_record(text, test_expectation(), "mem").ok());
}

}  // namespace
}  // namespace dsflash::testing
