// Helpers for the io tests: a scratch directory per test and paths to the shared goldens/spec.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/model_config.h"

namespace dsflash::testing {

inline std::string shared_dir() { return DSFLASH_SHARED_DIR; }
inline std::string spec_path(const std::string& name) { return shared_dir() + "/spec/" + name; }
inline std::string golden_checkpoint(const std::string& golden) {
  return shared_dir() + "/goldens/" + golden + "/checkpoint";
}

// A fresh directory under the system temp dir, removed when the object goes away.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dsflash-io-XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    if (made == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    path_ = made;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  void write(const std::string& name, const std::string& bytes) const {
    std::filesystem::create_directories(std::filesystem::path(file(name)).parent_path());
    std::ofstream out(file(name), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

 private:
  std::string path_;
};

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Loads a config, failing the current test (not aborting it) when it does not load.
inline ModelConfig load_config(const std::string& path) {
  auto c = ModelConfig::load(path);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? c.value() : ModelConfig{};
}

}  // namespace dsflash::testing
