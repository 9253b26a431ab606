#include "prefix/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace dsflash::prefix {
namespace {

constexpr const char* kRecordSuffix = ".kvb";
constexpr size_t kHashDigits = 16;

std::string hash_name(uint64_t hash) {
  char text[kHashDigits + 1];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

// "<16 hex>.kvb" -> its hash.
std::optional<uint64_t> parse_record_name(const std::string& name) {
  if (name.size() != kHashDigits + 4 || name.compare(kHashDigits, 4, kRecordSuffix) != 0) return std::nullopt;
  uint64_t hash = 0;
  for (size_t i = 0; i < kHashDigits; ++i) {
    const char c = name[i];
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return std::nullopt;
    hash = (hash << 4) | static_cast<uint64_t>(digit);
  }
  return hash;
}

// ".<hash>.<pid>.<n>.tmp" -> the writer's pid.
std::optional<pid_t> parse_temporary_name(const std::string& name) {
  if (name.size() < 6 || name[0] != '.' || name.compare(name.size() - 4, 4, ".tmp") != 0) return std::nullopt;
  const size_t first = name.find('.', 1), second = first == std::string::npos ? first : name.find('.', first + 1);
  if (second == std::string::npos) return std::nullopt;
  const std::string digits = name.substr(first + 1, second - first - 1);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return static_cast<pid_t>(std::stoll(digits));
}

bool process_gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

uint64_t mtime_ns(const struct stat& st) {
  return static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<uint64_t>(st.st_mtim.tv_nsec);
}

bool write_all(int fd, const uint8_t* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Errors that mean the directory cannot take records at all (as opposed to one bad write).
bool directory_failure(int error) {
  return error == ENOSPC || error == EDQUOT || error == EROFS || error == EACCES || error == EPERM || error == ENOENT;
}

}  // namespace

DiskTier::DiskTier(const DiskTierOptions& options, const RecordExpectation& expect)
    : options_(options), expect_(expect) {
  model_dir_ = (std::filesystem::path(options.dir) / expect.fingerprint.hex()).string();
}

std::unique_ptr<DiskTier> DiskTier::open(const DiskTierOptions& options, const RecordExpectation& expect) {
  std::unique_ptr<DiskTier> tier(new DiskTier(options, expect));
  std::lock_guard<std::mutex> lock(tier->mutex_);
  std::error_code ec;
  std::filesystem::create_directories(tier->model_dir_, ec);
  if (ec) {
    tier->disable("cannot create " + tier->model_dir_ + ": " + ec.message());
    return tier;
  }
  // Probe: a directory that exists but cannot take a file (read-only, full) disables the tier now, not later.
  const std::string probe = tier->model_dir_ + "/.probe." + std::to_string(getpid()) + ".tmp";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const uint8_t byte = 0;
  if (fd < 0 || !write_all(fd, &byte, 1) || ::fsync(fd) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(probe.c_str());
    tier->disable("cannot write in " + tier->model_dir_ + ": " + std::strerror(error));
    return tier;
  }
  ::close(fd);
  ::unlink(probe.c_str());
  tier->enabled_ = true;
  tier->scan();
  tier->writer_ = std::thread([t = tier.get()] { t->writer_loop(); });
  return tier;
}

DiskTier::~DiskTier() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_writer_.notify_all();
  if (writer_.joinable()) writer_.join();
}

bool DiskTier::enabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return enabled_;
}

void DiskTier::disable(const std::string& reason) {
  if (enabled_ || notices_.empty()) notices_.push_back("prefix cache: SSD tier off: " + reason);
  enabled_ = false;
  counters_.dropped_writes += static_cast<int64_t>(queue_.size());
  queue_.clear();
}

std::string DiskTier::record_path(uint64_t hash) const { return model_dir_ + "/" + hash_name(hash) + kRecordSuffix; }

void DiskTier::touch(uint64_t hash, int64_t size) {
  auto it = index_.find(hash);
  if (it != index_.end()) {
    lru_.erase({it->second.last_used, hash});
    bytes_ -= it->second.size;
  } else {
    it = index_.emplace(hash, Entry{}).first;
  }
  it->second.size = size;
  it->second.last_used = ++clock_;
  lru_.insert({it->second.last_used, hash});
  bytes_ += size;
}

void DiskTier::forget(uint64_t hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  lru_.erase({it->second.last_used, hash});
  bytes_ -= it->second.size;
  index_.erase(it);
}

void DiskTier::scan() {
  DIR* dir = ::opendir(model_dir_.c_str());
  if (dir == nullptr) return;
  std::vector<std::pair<uint64_t, std::pair<uint64_t, int64_t>>> found;  // (mtime, (hash, size))
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == ".." || name == ".lock") continue;
    struct stat st {};
    const std::string path = model_dir_ + "/" + name;
    if (::stat(path.c_str(), &st) != 0) continue;
    if (const auto hash = parse_record_name(name); hash && S_ISREG(st.st_mode)) {
      found.push_back({mtime_ns(st), {*hash, static_cast<int64_t>(st.st_size)}});
    } else if (const auto pid = parse_temporary_name(name)) {
      if (*pid != getpid() && process_gone(*pid)) ::unlink(path.c_str());  // a dead writer's leftover
    } else {
      ++counters_.foreign_files;
    }
  }
  ::closedir(dir);
  // Oldest file first gets the smallest clock: LRU order across restarts follows the files' times.
  std::sort(found.begin(), found.end());
  for (const auto& [mtime, record] : found) touch(record.first, record.second);
}

std::optional<BlockRecord> DiskTier::read(uint64_t block_hash) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!enabled_) return std::nullopt;
  }
  const std::string path = record_path(block_hash);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.misses;
    forget(block_hash);  // evicted by another process
    return std::nullopt;
  }
  struct stat st {};
  std::vector<uint8_t> bytes;
  bool read_ok = ::fstat(fd, &st) == 0;
  if (read_ok) {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    bytes.resize(done);
  }
  ::close(fd);
  auto record = decode_record(bytes, expect_, path);
  std::lock_guard<std::mutex> lock(mutex_);
  if (record.ok() && record->block_hash != block_hash) {
    record = Status::Error(path + ": holds block " + hash_name(record->block_hash) + ", not the one its name says");
  }
  if (!record.ok()) {
    ++counters_.corrupt_removed;
    ++counters_.misses;
    notices_.push_back("prefix cache: removed a damaged record: " + record.status().message());
    ::unlink(path.c_str());
    forget(block_hash);
    return std::nullopt;
  }
  ++counters_.hits;
  touch(block_hash, static_cast<int64_t>(bytes.size()));
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // LRU order survives a restart
  return std::move(*record);
}

bool DiskTier::write_async(BlockRecord record) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!enabled_ || static_cast<int64_t>(queue_.size()) >= options_.writer_queue_records) {
      ++counters_.dropped_writes;
      return false;
    }
    queue_.push_back(std::move(record));
  }
  wake_writer_.notify_one();
  return true;
}

void DiskTier::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

void DiskTier::writer_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_writer_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, everything written
    BlockRecord record = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    write_one(record);
    evict_over_budget();
    lock.lock();
    writing_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
  writing_ = false;
  idle_.notify_all();
}

void DiskTier::write_one(const BlockRecord& record) {
  static_assert(sizeof(pid_t) <= sizeof(long long));
  const std::vector<uint8_t> bytes = encode_record(record);
  uint64_t sequence;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!enabled_) return;
    sequence = ++clock_;
  }
  const std::string final_path = record_path(record.block_hash);
  const std::string temp_path = model_dir_ + "/." + hash_name(record.block_hash) + "." + std::to_string(getpid()) +
                                "." + std::to_string(sequence) + ".tmp";
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write_all(fd, bytes.data(), bytes.size()) && ::fsync(fd) == 0;
  int error = ok ? 0 : errno;
  if (fd >= 0) ok = (::close(fd) == 0) && ok;
  if (ok && ::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    ok = false;
    error = errno;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!ok) {
    ::unlink(temp_path.c_str());
    if (directory_failure(error)) {
      disable("writing " + final_path + ": " + std::strerror(error));
    } else {
      ++counters_.dropped_writes;
    }
    return;
  }
  ++counters_.writes;
  touch(record.block_hash, static_cast<int64_t>(bytes.size()));
}

void DiskTier::evict_over_budget() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes_ <= options_.budget_bytes) return;
  }
  // One evicting process at a time per directory; a lock that cannot be had skips this pass.
  const std::string lock_path = model_dir_ + "/.lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return;
  if (::flock(lock_fd, LOCK_EX) == 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    while (bytes_ > options_.budget_bytes && !lru_.empty()) {
      const uint64_t hash = lru_.begin()->second;
      ::unlink(record_path(hash).c_str());
      forget(hash);
      ++counters_.evicted;
    }
    ::flock(lock_fd, LOCK_UN);
  }
  ::close(lock_fd);
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  DiskTierStats s = counters_;
  s.enabled = enabled_;
  s.records = static_cast<int64_t>(index_.size());
  s.bytes = bytes_;
  return s;
}

std::vector<std::string> DiskTier::take_notices() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  out.swap(notices_);
  return out;
}

Result<std::vector<CacheDirModel>> scan_cache_dir(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return Status::Error(dir + ": no such cache directory");
  std::vector<CacheDirModel> models;
  for (const auto& sub : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = sub.path().filename().string();
    if (!sub.is_directory() || name.size() != 32 || name.find_first_not_of("0123456789abcdef") != std::string::npos) {
      continue;
    }
    CacheDirModel model;
    model.fingerprint_hex = name;
    for (const auto& file : std::filesystem::directory_iterator(sub.path(), ec)) {
      const std::string file_name = file.path().filename().string();
      if (file_name == ".lock") continue;
      struct stat st {};
      if (::stat(file.path().c_str(), &st) != 0) continue;
      if (parse_record_name(file_name)) {
        ++model.records;
        model.bytes += st.st_size;
        const int64_t t = st.st_mtim.tv_sec;
        model.oldest_unix_s = model.oldest_unix_s == 0 ? t : std::min(model.oldest_unix_s, t);
        model.newest_unix_s = std::max(model.newest_unix_s, t);
      } else if (parse_temporary_name(file_name)) {
        ++model.temporary_files;
      } else {
        ++model.foreign_files;
      }
    }
    models.push_back(model);
  }
  if (ec) return Status::Error(dir + ": " + ec.message());
  return models;
}

}  // namespace dsflash::prefix
