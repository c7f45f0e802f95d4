// baton/train/json/safetensors.hpp — safetensors files (the format PyTorch and Hugging Face
// load), written to the published specification and read with every rule of it checked:
//
//   8 bytes    N, the header's length (unsigned 64-bit, little-endian)
//   N bytes    a JSON object, UTF-8, padded with spaces to a multiple of 8 bytes:
//                {"__metadata__": {"key": "text", ...},
//                 "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   the data   every tensor's elements, row-major and little-endian, tensors back to back in
//              the order of their offsets (relative to the start of the data): no gap, no overlap
//
// A reader here refuses, naming the file and the rule, a header length past the end of the file,
// a header that is not a JSON object, a key given twice, an unknown dtype, a shape or offsets
// that are not non-negative integers, offsets whose byte count is not the shape's, offsets past
// the end of the data, overlapping tensors and bytes that belong to no tensor.
#pragma once

#include <baton/core/sizes.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/train/checkpoint_error.hpp>
#include <baton/train/checkpoint_state.hpp>
#include <baton/train/detail/checkpoint_files.hpp>
#include <baton/train/detail/json/support.hpp>
#include <baton/train/detail/xxh64.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

namespace baton::train {

static_assert(std::endian::native == std::endian::little,
              "baton's safetensors files hold the data as the host does, and the format is little-endian: "
              "checkpoints need a little-endian host");

/// A tensor to write: its name, type, shape and elements (shape's product x element_bytes).
struct tensor_bytes {
  std::string name;
  tensor_dtype dtype = tensor_dtype::F32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;
};

/// A tensor in a file: where its bytes lie, relative to the start of the data.
struct safetensors_tensor {
  std::string name;
  tensor_dtype dtype = tensor_dtype::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
  std::uint64_t bytes() const noexcept { return end - begin; }
};

/// What writing a file made: its size and the XXH64 of all its bytes.
struct written_file {
  std::uint64_t bytes = 0;
  std::uint64_t xxh64 = 0;
};

/// Writes a safetensors file of `tensors` (in that order) with `metadata`, flushed to the disk
/// (fsync) before it returns. Throws checkpoint_error (usage) for a name given twice, empty or
/// "__metadata__", or bytes that are not the shape's, and (io) when the system refuses.
inline written_file write_safetensors(const std::filesystem::path& path, std::span<const tensor_bytes> tensors,
                                      const std::map<std::string, std::string>& metadata = {}) {
  namespace dj = detail::train::json;
  const auto usage = [&](const std::string& what) {
    return checkpoint_error(checkpoint_error::kind::usage, "cannot write " + detail::train::quoted(path) + ": " + what);
  };
  dj::value header = dj::value::object();
  if (!metadata.empty()) {
    dj::value m = dj::value::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::uint64_t offset = 0;
  std::set<std::string_view> names;
  for (const tensor_bytes& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") throw usage("a tensor may not be named '" + t.name + "'");
    if (!names.insert(t.name).second) throw usage("the tensor name '" + t.name + "' is given twice");
    std::uint64_t elements = 1;
    for (std::int64_t d : t.shape) {
      if (d < 0) throw usage("tensor '" + t.name + "' has the shape " + detail::core::shape_text(t.shape));
      elements *= static_cast<std::uint64_t>(d);
    }
    if (elements * element_bytes(t.dtype) != t.bytes.size())
      throw usage("tensor '" + t.name + "' (" + std::string(to_string(t.dtype)) + " " + detail::core::shape_text(t.shape) + ") needs " +
                  std::to_string(elements * element_bytes(t.dtype)) + " bytes but " + std::to_string(t.bytes.size()) +
                  " are given");
    header[t.name] = {{"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // a name that is not UTF-8
    throw usage(std::string("a name or metadata text is not valid UTF-8: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data start 8-byte aligned
  std::array<std::byte, 8> length{};
  for (std::size_t i = 0; i < 8; ++i) length[i] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xffu);

  detail::train::file_handle f = detail::train::create_file(path);
  // The checksum costs a good part of a write's time: for a large file a second thread
  // computes it while this one writes (both only read the bytes; it is joined before they
  // can change, also when a write throws).
  detail::train::xxh64 hash;
  const auto hash_all = [&] {
    hash.update(length);
    hash.update(std::as_bytes(std::span<const char>(text.data(), text.size())));
    for (const tensor_bytes& t : tensors) hash.update(t.bytes);
  };
  std::jthread hasher;
  if (offset >= (std::uint64_t{8} << 20)) hasher = std::jthread(hash_all);
  else hash_all();
  // Small tensors are gathered into one buffer, large ones written from where they lie.
  std::vector<std::byte> buffer;
  buffer.reserve(std::size_t{1} << 20);
  const auto put = [&](std::span<const std::byte> bytes) {
    if (buffer.size() + bytes.size() > buffer.capacity()) {
      f.write_all(buffer);
      buffer.clear();
    }
    if (bytes.size() >= buffer.capacity()) {
      f.write_all(bytes);
    } else {
      buffer.insert(buffer.end(), bytes.begin(), bytes.end());
    }
  };
  put(length);
  put(std::as_bytes(std::span<const char>(text.data(), text.size())));
  for (const tensor_bytes& t : tensors) put(t.bytes);
  f.write_all(buffer);
  f.sync();
  f.close();
  if (hasher.joinable()) hasher.join();
  return {8 + text.size() + offset, hash.digest()};
}

/// A safetensors file opened for reading: the constructor reads and checks the header (the
/// rules in this file's comment) against the file's size.
class safetensors_file {
 public:
  /// Header lengths above this are refused as damaged (the limit of the reference reader).
  static constexpr std::uint64_t max_header_bytes = 100'000'000;

  explicit safetensors_file(std::filesystem::path path)
      : path_(std::move(path)), file_(detail::train::open_for_reading(path_)) {
    size_ = file_.size();
    std::array<std::byte, 8> length{};
    if (size_ < 8 || !file_.read_exact(length))
      fail(checkpoint_error::kind::truncated, "it has " + std::to_string(size_) + " bytes, fewer than the 8 of the header length");
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(length[i]) << (8 * i);
    if (n > max_header_bytes)
      fail(checkpoint_error::kind::damaged, "its header length " + std::to_string(n) + " is over the format's limit of " +
                                                std::to_string(max_header_bytes) + " bytes");
    if (n > size_ - 8)
      fail(checkpoint_error::kind::truncated, "its header length is " + std::to_string(n) + " bytes but only " +
                                                  std::to_string(size_ - 8) + " bytes follow");
    header_.resize(8 + n);
    std::copy(length.begin(), length.end(), header_.begin());
    if (!file_.read_exact(std::span<std::byte>(header_).subspan(8)))
      fail(checkpoint_error::kind::truncated, "the file ends inside its header");
    parse_header(std::string_view(reinterpret_cast<const char*>(header_.data() + 8), n));
  }

  const std::filesystem::path& path() const noexcept { return path_; }
  /// The file's size in bytes, and where the data start (8 + the header's length).
  std::uint64_t file_bytes() const noexcept { return size_; }
  std::uint64_t data_begin() const noexcept { return header_.size(); }
  /// The tensors in the order of their offsets.
  const std::vector<safetensors_tensor>& tensors() const noexcept { return tensors_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const safetensors_tensor* find(std::string_view name) const noexcept {
    for (const auto& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }

  /// Reads the whole file once, from its start: the data of each tensor go into
  /// `destination(const safetensors_tensor&)` when that returns a non-empty std::span<std::byte>
  /// (of exactly the tensor's byte count), and are only hashed otherwise. Returns the XXH64 of
  /// every byte of the file, for the caller to compare with a checksum kept elsewhere.
  template <class Destination>
  std::uint64_t read(Destination&& destination) {
    detail::train::xxh64 hash;
    hash.update(header_);
    if (::lseek(file_.fd(), static_cast<off_t>(header_.size()), SEEK_SET) < 0) detail::train::fail_io("seek in", path_, errno);
    file_.will_read_sequentially();
    std::vector<std::byte> scratch;
    for (const safetensors_tensor& t : tensors_) {
      const std::span<std::byte> into = destination(t);
      if (!into.empty()) {
        if (into.size() != t.bytes())
          throw checkpoint_error(checkpoint_error::kind::usage,
                                 "reading " + detail::train::quoted(path_) + ": tensor '" + t.name + "' has " +
                                     std::to_string(t.bytes()) + " bytes but its destination " + std::to_string(into.size()));
        if (!file_.read_exact(into)) fail(checkpoint_error::kind::truncated, "it ends inside tensor '" + t.name + "'");
        hash.update(into);
        continue;
      }
      scratch.resize(std::min<std::uint64_t>(t.bytes(), std::uint64_t{1} << 22));
      for (std::uint64_t left = t.bytes(); left > 0;) {
        const auto chunk = std::span<std::byte>(scratch).first(static_cast<std::size_t>(std::min<std::uint64_t>(left, scratch.size())));
        if (!file_.read_exact(chunk)) fail(checkpoint_error::kind::truncated, "it ends inside tensor '" + t.name + "'");
        hash.update(chunk);
        left -= chunk.size();
      }
    }
    return hash.digest();
  }

  /// One tensor's values (without the whole-file checksum: a checkpoint's loader checks that).
  /// Throws checkpoint_error (other_model) when the file has no such tensor or another dtype.
  template <class T>
  host_tensor<T> load(std::string_view name) {
    const safetensors_tensor* t = find(name);
    if (t == nullptr)
      throw checkpoint_error(checkpoint_error::kind::other_model,
                             detail::train::quoted(path_) + " has no tensor '" + std::string(name) + "'");
    if (t->dtype != dtype_of<T>())
      throw checkpoint_error(checkpoint_error::kind::other_model,
                             detail::train::quoted(path_) + ": tensor '" + t->name + "' is " + std::string(to_string(t->dtype)) +
                                 ", not " + std::string(to_string(dtype_of<T>())));
    host_tensor<T> out = host_tensor<T>::for_overwrite(t->shape);
    auto bytes = std::as_writable_bytes(std::span<T>(out.data(), static_cast<std::size_t>(out.size())));
    for (std::size_t done = 0; done < bytes.size();) {
      const ::ssize_t n = ::pread(file_.fd(), bytes.data() + done, bytes.size() - done,
                                  static_cast<off_t>(data_begin() + t->begin + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) detail::train::fail_io("read", path_, errno);
      if (n == 0) fail(checkpoint_error::kind::truncated, "it ends inside tensor '" + t->name + "'");
      done += static_cast<std::size_t>(n);
    }
    return out;
  }

 private:
  [[noreturn]] void fail(checkpoint_error::kind k, const std::string& what) const {
    throw checkpoint_error(k, detail::train::quoted(path_) + " is not a valid safetensors file: " + what);
  }

  void parse_header(std::string_view text) {
    namespace dj = detail::train::json;
    using k = checkpoint_error::kind;
    if (text.empty() || text.front() != '{') fail(k::damaged, "its header does not start with '{'");
    const dj::value header = dj::parse(text, detail::train::quoted(path_) + "'s header");
    if (!header.is_object()) fail(k::damaged, "its header is not a JSON object");
    const std::uint64_t data = size_ - header_.size();
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) fail(k::damaged, "__metadata__ is not an object");
        for (const auto& [key, v] : entry.items()) {
          if (!v.is_string()) fail(k::damaged, "__metadata__ '" + key + "' is not a string");
          metadata_[key] = v.get<std::string>();
        }
        continue;
      }
      const std::string what = "tensor '" + name + "'";
      if (!entry.is_object()) fail(k::damaged, what + " is not an object");
      for (const auto& [key, v] : entry.items()) {
        (void)v;
        if (key != "dtype" && key != "shape" && key != "data_offsets") fail(k::damaged, what + " has an unknown field '" + key + "'");
      }
      if (!entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
        fail(k::damaged, what + " lacks one of dtype, shape, data_offsets");
      safetensors_tensor t;
      t.name = name;
      const auto dtype = entry["dtype"].is_string() ? tensor_dtype_from(entry["dtype"].get<std::string>()) : std::nullopt;
      if (!dtype) fail(k::damaged, what + " has an unknown dtype " + entry["dtype"].dump());
      t.dtype = *dtype;
      const dj::value& shape = entry["shape"];
      if (!shape.is_array()) fail(k::damaged, what + "'s shape is not an array");
      std::uint64_t bytes = element_bytes(t.dtype);
      bool overflow = false;
      for (const auto& d : shape) {
        if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
          fail(k::damaged, what + "'s shape " + shape.dump() + " is not a list of non-negative integers");
        const std::uint64_t e = d.get<std::uint64_t>();
        if (e != 0 && bytes > UINT64_MAX / e) overflow = true;
        bytes *= e;
        t.shape.push_back(static_cast<std::int64_t>(e));
      }
      const dj::value& offsets = entry["data_offsets"];
      if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
        fail(k::damaged, what + "'s data_offsets " + offsets.dump() + " are not two non-negative integers");
      t.begin = offsets[0].get<std::uint64_t>();
      t.end = offsets[1].get<std::uint64_t>();
      if (t.end < t.begin) fail(k::damaged, what + "'s data_offsets " + offsets.dump() + " end before they begin");
      if (overflow || t.end - t.begin != bytes)
        fail(k::damaged, what + " (" + std::string(to_string(t.dtype)) + " " + detail::core::shape_text(t.shape) + ") needs " +
                             (overflow ? std::string("more than 2^64") : std::to_string(bytes)) + " bytes but its data_offsets " +
                             offsets.dump() + " hold " + std::to_string(t.end - t.begin));
      if (t.end > data)
        fail(k::truncated, what + " ends at byte " + std::to_string(t.end) + " of the data but the file holds only " +
                               std::to_string(data) + " bytes of data");
      tensors_.push_back(std::move(t));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t covered = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const safetensors_tensor& t = tensors_[i];
      if (t.begin < covered)
        fail(k::damaged, "tensors '" + tensors_[i - 1].name + "' and '" + t.name + "' overlap (data_offsets [" +
                             std::to_string(tensors_[i - 1].begin) + ", " + std::to_string(tensors_[i - 1].end) + "] and [" +
                             std::to_string(t.begin) + ", " + std::to_string(t.end) + "])");
      if (t.begin > covered)
        fail(k::damaged, "the data bytes [" + std::to_string(covered) + ", " + std::to_string(t.begin) +
                             ") belong to no tensor");
      covered = t.end;
    }
    if (covered != data)
      fail(k::damaged, "the data bytes [" + std::to_string(covered) + ", " + std::to_string(data) + ") belong to no tensor");
  }

  std::filesystem::path path_;
  detail::train::file_handle file_;
  std::uint64_t size_ = 0;
  std::vector<std::byte> header_;  // the 8 length bytes and the header text, hashed first
  std::vector<safetensors_tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace baton::train
