// safetensors reader/writer: round trip, every dtype, and one crafted bad file per validation error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "io/dtype.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace dsflash {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

// A safetensors file from a raw header string and payload (for crafting bad files).
std::string raw_file(const std::string& header, const std::string& payload, uint64_t declared_len) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(declared_len >> (8 * i));
  return out + header + payload;
}
std::string raw_file(const std::string& header, const std::string& payload) {
  return raw_file(header, payload, header.size());
}

TEST(DType, NamesRoundTripAndSizes) {
  const std::pair<const char*, size_t> cases[] = {{"BF16", 2}, {"F16", 2}, {"F32", 4},     {"F64", 8},
                                                  {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I8", 1}, {"U8", 1},
                                                  {"I16", 2},  {"I32", 4},     {"I64", 8},   {"BOOL", 1}};
  for (const auto& [name, bytes] : cases) {
    DType dt;
    ASSERT_TRUE(parse_dtype(name, &dt)) << name;
    EXPECT_STREQ(dtype_name(dt), name);
    EXPECT_EQ(dtype_bytes(dt, 10), 10 * bytes) << name;
  }
  DType f4;
  ASSERT_TRUE(parse_dtype("F4", &f4));
  EXPECT_EQ(f4, DType::kF4);
  EXPECT_EQ(dtype_bytes(DType::kF4, 64 * 128), 64u * 128u / 2u);
  EXPECT_EQ(dtype_bytes(DType::kF4, 3), 2u);  // odd counts round up to whole bytes
  DType unknown;
  EXPECT_FALSE(parse_dtype("FP4x2", &unknown));
  EXPECT_FALSE(parse_dtype("bf16", &unknown));  // names are case-sensitive in safetensors
  EXPECT_EQ(shape_to_string({2048, 128}), "[2048, 128]");
}

TEST(Safetensors, WriterReaderRoundTripIsZeroCopy) {
  ScratchDir dir;
  SafetensorsWriter w;
  std::vector<uint8_t> a(2 * 3 * 2);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7 + 1);
  w.add("a.weight", DType::kBF16, {2, 3}, a);
  w.add("experts.w1", DType::kF4, {4, 64}, std::vector<uint8_t>(128, 0x5a));
  w.add("packed", DType::kI8, {4, 32}, std::vector<uint8_t>(128, 0x21));
  w.add("scalar", DType::kF32, {}, {0, 0, 128, 63});
  w.add("empty", DType::kI64, {0, 5}, {});
  w.add_metadata("format", "pt");
  EXPECT_EQ(w.payload_bytes(), 12u + 128u + 128u + 4u);
  ASSERT_TRUE(w.write(dir.file("x.safetensors")).ok());

  auto f = SafetensorsFile::open(dir.file("x.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->tensors().size(), 5u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const TensorView* t = f->find("a.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kBF16);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->num_bytes, 12u);
  EXPECT_EQ(std::memcmp(t->data, a.data(), a.size()), 0);
  EXPECT_EQ(t->file, dir.file("x.safetensors"));
  const TensorView* f4 = f->find("experts.w1");
  ASSERT_NE(f4, nullptr);
  EXPECT_EQ(f4->num_elements(), 256);
  EXPECT_EQ(f4->num_bytes, 128u);
  EXPECT_EQ(f4->data[0], 0x5a);
  EXPECT_EQ(*f->find("scalar")->as<float>(), 1.0f);
  EXPECT_EQ(f->find("empty")->num_bytes, 0u);
  EXPECT_EQ(f->find("missing"), nullptr);
  // Zero copy: every view points into the one mapping, in the order written, payload 8-byte aligned.
  const uint8_t* base = f->find("a.weight")->data;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % 8, 0u);
  EXPECT_EQ(f->find("experts.w1")->data, base + 12);
  // Moving the file keeps the views valid (they point into the mapping, not into the object).
  SafetensorsFile moved = std::move(f.value());
  EXPECT_EQ(moved.find("packed")->data[5], 0x21);
}

TEST(Safetensors, WriterRejectsWrongByteCount) {
  ScratchDir dir;
  SafetensorsWriter w;
  w.add("t", DType::kF32, {3}, std::vector<uint8_t>(8));
  Status s = w.write(dir.file("bad.safetensors"));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'t'"));
  EXPECT_THAT(s.message(), HasSubstr("needs 12"));
}

struct BadCase {
  const char* label;
  std::string bytes;
  std::vector<std::string> expected;  // substrings of the error
};

TEST(Safetensors, EveryValidationErrorNamesFileTensorAndField) {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string p8(8, '\0');
  std::vector<BadCase> cases = {
      {"truncated", std::string("\x10\x00\x00", 3), {"truncated", "3 bytes"}},
      {"empty file", "", {"truncated"}},
      {"header length beyond the file", raw_file("{}", "", 1000), {"header length 1000", "past the end"}},
      {"header length near 2^64", raw_file("{}", "", ~0ull), {"header length", "past the end"}},
      {"malformed JSON", raw_file(R"({"t":{"dtype":"F32",)", ""), {"malformed JSON header"}},
      {"header not an object", raw_file("[1,2]", ""), {"not an object"}},
      {"unknown dtype", raw_file(R"({"t":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", p8),
       {"tensor 't'", "field 'dtype'", "unknown dtype 'F12'"}},
      {"dtype missing", raw_file(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", p8), {"tensor 't'", "'dtype'"}},
      {"negative shape", raw_file(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", p8),
       {"tensor 't'", "field 'shape'"}},
      {"shape not a list", raw_file(R"({"t":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", p8),
       {"tensor 't'", "field 'shape'"}},
      {"offsets beyond the payload", raw_file(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", p8),
       {"tensor 't'", "data_offsets", "out of range", "payload is 8 bytes"}},
      {"offsets reversed", raw_file(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", p8),
       {"tensor 't'", "end before begin"}},
      {"offsets not a pair", raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", p8),
       {"tensor 't'", "data_offsets"}},
      {"negative offset", raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", p8),
       {"tensor 't'", "negative"}},
      {"byte size mismatch", raw_file(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", p8),
       {"tensor 't'", "spans 8 bytes", "F32", "[3]", "needs 12"}},
      {"F4 byte size uses the logical count", raw_file(R"({"t":{"dtype":"F4","shape":[4,4],"data_offsets":[0,16]}})",
                                                       std::string(16, '\0')),
       {"tensor 't'", "needs 8"}},
      {"overlap",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                p8),
       {"overlap", "'a'", "'b'"}},
      {"metadata value not a string", raw_file(R"({"__metadata__":{"format":1},)" + ok_entry + "}", p8),
       {"__metadata__", "'format'"}},
      {"shape overflow",
       raw_file(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", p8),
       {"tensor 't'", "overflows"}},
  };
  for (const BadCase& c : cases) {
    ScratchDir dir;
    dir.write("bad.safetensors", c.bytes);
    auto f = SafetensorsFile::open(dir.file("bad.safetensors"));
    ASSERT_FALSE(f.ok()) << c.label;
    EXPECT_THAT(f.status().message(), HasSubstr(dir.file("bad.safetensors"))) << c.label;
    for (const std::string& want : c.expected) {
      EXPECT_THAT(f.status().message(), HasSubstr(want)) << c.label;
    }
  }
}

TEST(Safetensors, ValidHandCraftedFileOpens) {
  // The crafted-file helper itself produces readable files (so the failures above are the intended ones).
  ScratchDir dir;
  dir.write("ok.safetensors",
            raw_file(R"({"__metadata__":{"format":"pt"},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                     std::string(8, '\0')));
  auto f = SafetensorsFile::open(dir.file("ok.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->find("t")->num_elements(), 2);
}

// Every truncation and many single-byte corruptions of a valid file give an error or a valid file,
// never a crash; a view never points outside the file.
TEST(Safetensors, CorruptedFilesNeverCrash) {
  ScratchDir dir;
  SafetensorsWriter w;
  w.add("a", DType::kBF16, {4, 8}, std::vector<uint8_t>(64, 1));
  w.add("b", DType::kF4, {2, 64}, std::vector<uint8_t>(64, 2));
  w.add("c", DType::kI64, {3}, std::vector<uint8_t>(24, 3));
  ASSERT_TRUE(w.write(dir.file("good.safetensors")).ok());
  const std::string good = testing::read_text(dir.file("good.safetensors"));
  auto check = [&](const std::string& bytes) {
    dir.write("x.safetensors", bytes);
    auto f = SafetensorsFile::open(dir.file("x.safetensors"));
    if (!f.ok()) {
      EXPECT_FALSE(f.status().message().empty());
      return false;
    }
    for (const TensorView& t : f->tensors()) {
      EXPECT_EQ(t.num_bytes, dtype_bytes(t.dtype, t.num_elements()));
    }
    return true;
  };
  int accepted = 0;
  for (size_t len = 0; len < good.size(); ++len) accepted += check(good.substr(0, len)) ? 1 : 0;
  EXPECT_EQ(accepted, 0) << "a truncated file was accepted";
  uint32_t state = 12345;  // fixed LCG: the same corruptions every run
  for (int i = 0; i < 400; ++i) {
    state = state * 1664525u + 1013904223u;
    std::string bad = good;
    size_t header_len = 0;
    for (int b = 7; b >= 0; --b) header_len = (header_len << 8) | static_cast<uint8_t>(good[static_cast<size_t>(b)]);
    const size_t header_end = 8 + header_len;  // corrupt the length field and the JSON header
    const size_t pos = state % header_end;
    bad[pos] = static_cast<char>((state >> 8) & 0xff);
    check(bad);
  }
  EXPECT_TRUE(check(good));
}

TEST(Safetensors, MissingFileAndDirectoryAreErrors) {
  ScratchDir dir;
  auto missing = SafetensorsFile::open(dir.file("nope.safetensors"));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.safetensors"));
  auto directory = SafetensorsFile::open(dir.path());
  ASSERT_FALSE(directory.ok());
}

}  // namespace
}  // namespace dsflash
