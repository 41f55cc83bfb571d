#include "runtime/kv_disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "base/hash.h"
#include "base/log.h"

namespace mr {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'M', 'R', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr const char* kSuffix = ".kvb";

struct Header {
  char magic[8];
  uint64_t config_key;
  uint64_t hash;
  uint64_t parent;
  uint32_t block_tokens, n_layer, kv_dim, reserved;
  uint64_t payload_bytes;
  uint64_t checksum;  // Hash64 over the header (this field zero), then the payload
};
static_assert(sizeof(Header) == 64);

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool ParseHex16(const std::string& s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

uint64_t Checksum(Header h, const void* tokens, size_t token_bytes, const void* kv, size_t kv_bytes) {
  h.checksum = 0;
  uint64_t c = Hash64(&h, sizeof h);
  c = Hash64(tokens, token_bytes, c);
  return Hash64(kv, kv_bytes, c);
}

bool WriteAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

KvDiskCache::KvDiskCache(const Options& opts, const Layout& layout) : opts_(opts), layout_(layout) {
  config_dir_ = (fs::path(opts.dir) / Hex16(layout.config_key)).string();
}

Result<std::unique_ptr<KvDiskCache>> KvDiskCache::Open(const Options& opts, const Layout& layout) {
  if (opts.dir.empty()) return InvalidArgument("KV disk cache: no directory");
  if (layout.n_layer <= 0 || layout.kv_dim <= 0 || layout.block_tokens <= 0)
    return InvalidArgument("KV disk cache: empty block layout");
  std::unique_ptr<KvDiskCache> c(new KvDiskCache(opts, layout));
  std::error_code ec;
  fs::create_directories(c->config_dir_, ec);
  if (ec) return Status(ErrorCode::kIo, "KV disk cache: cannot create " + c->config_dir_ + ": " + ec.message());
  if (::access(c->config_dir_.c_str(), R_OK | W_OK | X_OK) != 0)
    return Status(ErrorCode::kIo, "KV disk cache: " + c->config_dir_ + " is not writable: " + std::strerror(errno));
  try {
    MR_RETURN_IF_ERROR(c->Scan());
  } catch (const fs::filesystem_error& e) {
    return Status(ErrorCode::kIo, std::string("KV disk cache: reading ") + opts.dir + ": " + e.what());
  }
  c->writer_ = std::thread([p = c.get()] { p->WriterLoop(); });
  return c;
}

KvDiskCache::~KvDiskCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

size_t KvDiskCache::FileBytes() const {
  return sizeof(Header) + static_cast<size_t>(layout_.block_tokens) * sizeof(TokenId) +
         static_cast<size_t>(layout_.n_layer) * 2 * static_cast<size_t>(layout_.block_tokens * layout_.kv_dim) *
             sizeof(uint16_t);
}

std::string KvDiskCache::PathOf(uint64_t hash) const {
  return config_dir_ + "/" + Hex16(hash) + kSuffix;
}

Status KvDiskCache::Scan() {
  // Every configuration's block files, oldest use last; stale temporary files removed.
  struct Seen {
    File f;
    fs::file_time_type t;
  };
  std::vector<Seen> seen;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const fs::directory_entry& sub : fs::directory_iterator(opts_.dir, ec)) {
    uint64_t key;
    if (!sub.is_directory(ec) || !ParseHex16(sub.path().filename().string(), &key)) continue;
    for (const fs::directory_entry& e : fs::directory_iterator(sub.path(), ec)) {
      if (!e.is_regular_file(ec)) continue;
      const std::string name = e.path().filename().string();
      const auto t = e.last_write_time(ec);
      if (ec) continue;
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
        if (now - t > std::chrono::hours(1)) fs::remove(e.path(), ec);
        continue;
      }
      uint64_t hash;
      if (name.size() != 16 + 4 || name.compare(16, 4, kSuffix) != 0 || !ParseHex16(name.substr(0, 16), &hash))
        continue;
      Seen s;
      s.f.path = e.path().string();
      s.f.bytes = static_cast<size_t>(e.file_size(ec));
      s.f.hash = hash;
      s.f.ours = key == layout_.config_key;
      s.t = t;
      seen.push_back(std::move(s));
    }
  }
  std::sort(seen.begin(), seen.end(), [](const Seen& a, const Seen& b) { return a.t > b.t; });
  std::lock_guard<std::mutex> lock(mu_);
  for (Seen& s : seen) {
    stats_.bytes += s.f.bytes;
    lru_.push_back(std::move(s.f));
    auto it = std::prev(lru_.end());
    by_path_[it->path] = it;
    if (it->ours) ours_[it->hash] = it;
  }
  stats_.files = static_cast<int64_t>(lru_.size());
  EvictFor(0);  // a smaller budget than last time
  return Status::Ok();
}

bool KvDiskCache::Contains(uint64_t hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ours_.count(hash) != 0;
}

void KvDiskCache::Forget(uint64_t hash) {
  auto it = ours_.find(hash);
  if (it == ours_.end()) return;
  stats_.bytes -= it->second->bytes;
  --stats_.files;
  by_path_.erase(it->second->path);
  lru_.erase(it->second);
  ours_.erase(it);
}

bool KvDiskCache::Load(uint64_t hash, uint64_t parent, std::span<const TokenId> tokens, std::vector<uint16_t>* kv) {
  if (!Contains(hash)) return false;
  const std::string path = PathOf(hash);
  const size_t n_tok = static_cast<size_t>(layout_.block_tokens);
  const size_t kv_vals = static_cast<size_t>(layout_.n_layer) * 2 * n_tok * static_cast<size_t>(layout_.kv_dim);
  auto reject = [&](const char* why) {
    MR_LOGW("kvcache", "%s: %s; removed, the block will be recomputed", path.c_str(), why);
    ::unlink(path.c_str());
    std::lock_guard<std::mutex> lock(mu_);
    Forget(hash);
    ++stats_.rejected;
    return false;
  };
  if (tokens.size() != n_tok) return false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {  // removed by another process sharing the directory
    std::lock_guard<std::mutex> lock(mu_);
    Forget(hash);
    return false;
  }
  struct stat st {};
  Header h{};
  std::vector<TokenId> toks(n_tok);
  bool ok = ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == FileBytes() && ReadAll(fd, &h, sizeof h);
  ok = ok && ReadAll(fd, toks.data(), n_tok * sizeof(TokenId));
  if (ok) {
    kv->resize(kv_vals);
    ok = ReadAll(fd, kv->data(), kv_vals * sizeof(uint16_t));
  }
  ::close(fd);
  if (!ok) return reject("short or unreadable block file");
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return reject("not a block file of this version");
  if (h.config_key != layout_.config_key || h.hash != hash || h.block_tokens != n_tok ||
      h.n_layer != static_cast<uint64_t>(layout_.n_layer) || h.kv_dim != static_cast<uint64_t>(layout_.kv_dim) ||
      h.payload_bytes != FileBytes() - sizeof(Header))
    return reject("header does not match its name or this configuration");
  if (h.checksum != Checksum(h, toks.data(), n_tok * sizeof(TokenId), kv->data(), kv_vals * sizeof(uint16_t)))
    return reject("checksum mismatch");
  // A valid file for another prefix with the same hash (a 64-bit collision): not ours to use,
  // and not damaged either.
  if (h.parent != parent || !std::equal(tokens.begin(), tokens.end(), toks.begin())) return false;
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // recency survives restarts
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ours_.find(hash);
  if (it != ours_.end()) lru_.splice(lru_.begin(), lru_, it->second);
  ++stats_.loaded;
  return true;
}

void KvDiskCache::Save(uint64_t hash, uint64_t parent, std::span<const TokenId> tokens,
                       std::shared_ptr<const std::vector<uint16_t>> kv) {
  if (tokens.size() != static_cast<size_t>(layout_.block_tokens) || kv == nullptr) return;
  const size_t bytes = FileBytes();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ours_.count(hash) != 0 || queued_.count(hash) != 0 || bytes > opts_.byte_budget) return;
    if (pending_bytes_ + bytes > opts_.max_pending_bytes) {
      ++stats_.dropped;
      return;
    }
    queue_.push_back(Pending{hash, parent, std::vector<TokenId>(tokens.begin(), tokens.end()), std::move(kv)});
    queued_.insert(hash);
    pending_bytes_ += bytes;
  }
  cv_.notify_one();
}

void KvDiskCache::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

KvDiskCache::Stats KvDiskCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void KvDiskCache::EvictFor(size_t bytes) {
  while (!lru_.empty() && stats_.bytes + bytes > opts_.byte_budget) {
    File& f = lru_.back();
    std::error_code ec;
    fs::remove(f.path, ec);
    stats_.bytes -= f.bytes;
    --stats_.files;
    ++stats_.evicted;
    if (f.ours) ours_.erase(f.hash);
    by_path_.erase(f.path);
    lru_.pop_back();
  }
}

void KvDiskCache::WriterLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stop_, and everything queued is written
    Pending p = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    EvictFor(FileBytes());
    lock.unlock();
    const bool ok = Write(p);
    lock.lock();
    writing_ = false;
    queued_.erase(p.hash);
    pending_bytes_ -= FileBytes();
    if (ok) {
      const std::string path = PathOf(p.hash);
      if (by_path_.count(path) == 0) {
        lru_.push_front(File{path, FileBytes(), p.hash, true});
        by_path_[path] = lru_.begin();
        ours_[p.hash] = lru_.begin();
        stats_.bytes += FileBytes();
        ++stats_.files;
      }
      ++stats_.written;
    } else {
      ++stats_.failed;
    }
    if (queue_.empty()) idle_cv_.notify_all();
  }
  writing_ = false;
  idle_cv_.notify_all();
}

bool KvDiskCache::Write(const Pending& p) {
  static std::atomic<uint64_t> counter{0};
  const size_t n_tok = static_cast<size_t>(layout_.block_tokens);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.config_key = layout_.config_key;
  h.hash = p.hash;
  h.parent = p.parent;
  h.block_tokens = static_cast<uint32_t>(n_tok);
  h.n_layer = static_cast<uint32_t>(layout_.n_layer);
  h.kv_dim = static_cast<uint32_t>(layout_.kv_dim);
  h.payload_bytes = FileBytes() - sizeof(Header);
  h.checksum = Checksum(h, p.tokens.data(), n_tok * sizeof(TokenId), p.kv->data(), p.kv->size() * sizeof(uint16_t));
  const std::string path = PathOf(p.hash);
  const std::string tmp = config_dir_ + "/." + Hex16(p.hash) + "." + std::to_string(::getpid()) + "." +
                          std::to_string(counter.fetch_add(1)) + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    MR_LOGW("kvcache", "cannot create %s: %s", tmp.c_str(), std::strerror(errno));
    return false;
  }
  bool ok = WriteAll(fd, &h, sizeof h) && WriteAll(fd, p.tokens.data(), n_tok * sizeof(TokenId)) &&
            WriteAll(fd, p.kv->data(), p.kv->size() * sizeof(uint16_t));
  ok = (::close(fd) == 0) && ok;
  if (ok) ok = ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    MR_LOGW("kvcache", "cannot write %s: %s", path.c_str(), std::strerror(errno));
    ::unlink(tmp.c_str());
  }
  return ok;
}

}  // namespace mr
