// libFuzzer target: tokenizer encode / decode / streaming detokenizer on arbitrary bytes.
// Invariants: never crashes; decode(encode(x)) == x with ill-formed UTF-8 replaced; the streaming detokenizer
// equals decode; arbitrary ids (also out of range) decode without crashing.
// Tokenizer: $DSFLASH_FUZZ_TOKENIZER (default: the reconstructed V4.1 tokenizer in ../shared/tokenizer/).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

const dsflash::Tokenizer& tokenizer() {
  static const dsflash::Tokenizer* t = [] {
    const char* env = std::getenv("DSFLASH_FUZZ_TOKENIZER");
    const std::string path = env ? env : "../shared/tokenizer/deepseek_v41_tokenizer.reconstructed.json";
    auto r = dsflash::Tokenizer::from_file(path);
    if (!r.ok()) {
      std::fprintf(stderr, "fuzz_tokenizer: %s\n", r.status().message().c_str());
      std::abort();
    }
    return new dsflash::Tokenizer(std::move(*r));
  }();
  return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& tok = tokenizer();
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (bool split_special : {false, true}) {
    dsflash::EncodeOptions options;
    options.split_special_tokens = split_special;
    auto ids = tok.encode(text, options);
    if (!ids.ok()) {
      std::fprintf(stderr, "encode failed: %s\n", ids.status().message().c_str());
      std::abort();
    }
    const std::string decoded = tok.decode(*ids);
    if (decoded != dsflash::utf8::sanitize(text)) {
      std::fprintf(stderr, "round trip mismatch\n");
      std::abort();
    }
    dsflash::StreamingDetokenizer detok(tok);
    std::string streamed;
    for (int32_t id : *ids) streamed += detok.push(id);
    streamed += detok.finish();
    if (streamed != decoded) {
      std::fprintf(stderr, "streaming detokenizer mismatch\n");
      std::abort();
    }
  }
  // The same bytes read as ids (any value, including unknown and negative ones).
  std::vector<int32_t> raw_ids(size / 4);
  if (!raw_ids.empty()) std::memcpy(raw_ids.data(), data, raw_ids.size() * 4);
  const std::string d1 = tok.decode(raw_ids, false);
  const std::string d2 = tok.decode(raw_ids, true);
  dsflash::StreamingDetokenizer detok(tok, true);
  std::string streamed;
  for (int32_t id : raw_ids) streamed += detok.push(id);
  streamed += detok.finish();
  if (streamed != d2 || !dsflash::utf8::is_valid(d1)) {
    std::fprintf(stderr, "decode of raw ids inconsistent\n");
    std::abort();
  }
  return 0;
}
