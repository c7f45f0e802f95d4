// baton/train/detail/checkpoint_files.hpp — the file operations a checkpoint's atomicity rests
// on (POSIX): writing all of a buffer, fsync of a file and of a directory (a rename is durable
// only once its directory is synced), replacing a directory by another in one step, and reading
// exactly the bytes asked for. Every failure is a checkpoint_error naming the path and errno's
// text.
#pragma once

#include <baton/train/checkpoint_error.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace baton::detail::train {

using baton::train::checkpoint_error;
using problem = baton::train::checkpoint_error::kind;

inline std::string quoted(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

[[noreturn]] inline void fail_io(const std::string& what, const std::filesystem::path& p, int error) {
  throw checkpoint_error(problem::io, "cannot " + what + " " + quoted(p) + ": " + std::strerror(error));
}

/// A file descriptor that closes itself; close() reports what a lost write-back would.
class file_handle {
 public:
  file_handle() = default;
  file_handle(const std::filesystem::path& p, int flags, const char* what) : path_(p) {
    do fd_ = ::open(p.c_str(), flags | O_CLOEXEC, 0644);
    while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) fail_io(what, p, errno);
  }
  file_handle(file_handle&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  file_handle& operator=(file_handle&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(o.fd_, -1);
      path_ = std::move(o.path_);
    }
    return *this;
  }
  file_handle(const file_handle&) = delete;
  file_handle& operator=(const file_handle&) = delete;
  ~file_handle() {
    if (fd_ >= 0) ::close(fd_);
  }

  int fd() const noexcept { return fd_; }
  const std::filesystem::path& path() const noexcept { return path_; }

  void write_all(std::span<const std::byte> data) {
    while (!data.empty()) {
      const ::ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_io("write", path_, errno);
      }
      data = data.subspan(static_cast<std::size_t>(n));
    }
  }
  /// Reads exactly data.size() bytes; false at the end of the file before that.
  bool read_exact(std::span<std::byte> data) {
    while (!data.empty()) {
      const ::ssize_t n = ::read(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_io("read", path_, errno);
      }
      if (n == 0) return false;
      data = data.subspan(static_cast<std::size_t>(n));
    }
    return true;
  }
  std::uint64_t size() const {
    struct ::stat st {};
    if (::fstat(fd_, &st) != 0) fail_io("stat", path_, errno);
    return static_cast<std::uint64_t>(st.st_size);
  }
  void sync() {
    if (::fsync(fd_) != 0) fail_io("flush (fsync)", path_, errno);
  }
  void close() {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0 && errno != EINTR) fail_io("close", path_, errno);
  }
  /// Tells the kernel the file is read once from start to end (larger read-ahead).
  void will_read_sequentially() const noexcept { (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL); }

 private:
  int fd_ = -1;
  std::filesystem::path path_;
};

inline file_handle create_file(const std::filesystem::path& p) {
  return file_handle(p, O_WRONLY | O_CREAT | O_TRUNC, "create");
}
inline file_handle open_for_reading(const std::filesystem::path& p) { return file_handle(p, O_RDONLY, "open"); }

/// fsync of a directory: makes the entries created, renamed or removed in it durable.
inline void sync_directory(const std::filesystem::path& dir) {
  file_handle d(dir, O_RDONLY | O_DIRECTORY, "open the directory");
  d.sync();
}

/// Writes `text` to `target` so that a reader sees the old content or the new, never a part:
/// a temporary file beside it, flushed, renamed over it, the directory flushed.
inline void replace_file(const std::filesystem::path& target, std::string_view text) {
  const std::filesystem::path tmp = target.string() + ".tmp";
  file_handle f = create_file(tmp);
  f.write_all(std::as_bytes(std::span<const char>(text.data(), text.size())));
  f.sync();
  f.close();
  if (std::rename(tmp.c_str(), target.c_str()) != 0) fail_io("rename to " + quoted(target), tmp, errno);
  sync_directory(target.parent_path());
}

/// Puts the directory `from` at `to` in one step: a plain rename when `to` does not exist; when
/// it does (the same step saved again), an exchange of the two (Linux renameat2), after which
/// `from` holds the old one to delete. Returns whether `from` now holds an old directory.
inline bool move_directory_into_place(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code ec;
  if (!std::filesystem::exists(to, ec)) {
    if (std::rename(from.c_str(), to.c_str()) != 0) fail_io("rename to " + quoted(to), from, errno);
    return false;
  }
#if defined(__linux__) && defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS) fail_io("exchange with " + quoted(to), from, errno);
#endif
  // A file system without the exchange: move the old one aside first. A crash between the two
  // renames leaves `to` missing and `latest` naming it; the loader then says so.
  const std::filesystem::path aside = to.string() + ".replaced";
  std::filesystem::remove_all(aside, ec);
  if (std::rename(to.c_str(), aside.c_str()) != 0) fail_io("move aside", to, errno);
  if (std::rename(from.c_str(), to.c_str()) != 0) fail_io("rename to " + quoted(to), from, errno);
  std::filesystem::rename(aside, from, ec);
  return !ec;
}

}  // namespace baton::detail::train
