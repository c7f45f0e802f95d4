// baton/train/json/checkpoint.hpp — checkpoints of any trainer on any mesh: a directory of
// safetensors files and a manifest, written atomically, verified on load, and loaded on any
// other mesh (resharding), because every tensor is saved and found by its global name.
//
//   DIR/step-000120/manifest.json             format, step, data position, random states,
//                                             settings, and per file its size and XXH64
//   DIR/step-000120/model-00000.safetensors   the tensors rank 0 wrote in the group "model"
//   DIR/step-000120/optimizer-00000.safetensors
//   DIR/latest                                "step-000120": the last complete checkpoint
//
// Saving is collective. Rank 0 makes DIR/step-N.tmp/; every rank that writes (one replica of
// each tensor: `write_tensors`) writes its files there and flushes them (fsync); rank 0 writes
// the manifest, flushes it, renames the directory to step-N, flushes DIR, and last replaces
// `latest` the same way (a temporary file renamed over it). A process killed at any moment
// leaves `latest` naming the previous complete checkpoint. Then checkpoints older than the
// `keep` newest are deleted.
//
// Loading is collective too: every rank reads the manifest, checks the model's settings (the
// first difference named), that every file is there with its size, and reads from each file
// that holds one of its tensors the whole file (the tensors it holds go straight into its
// memory), comparing the file's XXH64 with the manifest's. A problem on any rank is thrown on
// every rank (the lowest rank's message), so none waits for the others.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/core/sizes.hpp>
#include <baton/train/checkpoint_error.hpp>
#include <baton/train/checkpoint_state.hpp>
#include <baton/train/detail/checkpoint_files.hpp>
#include <baton/train/detail/json/manifest.hpp>
#include <baton/train/detail/json/support.hpp>
#include <baton/train/json/safetensors.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace baton::train {

/// A directory of checkpoints: step-<N> subdirectories and the file `latest`. `keep` > 0 keeps
/// that many (the newest by step; one just saved is always kept) and deletes older ones after
/// each save; 0 keeps every one. One run saves into a directory at a time.
class checkpoint_directory {
 public:
  explicit checkpoint_directory(std::filesystem::path root, int keep = 0) : root_(std::move(root)), keep_(keep) {
    if (keep < 0)
      throw checkpoint_error(checkpoint_error::kind::usage,
                             "checkpoint_directory: keep = " + std::to_string(keep) + "; use 0 to keep every checkpoint, or K >= 1");
  }

  const std::filesystem::path& root() const noexcept { return root_; }
  int keep() const noexcept { return keep_; }

  /// The name of step N's checkpoint: "step-000120" (more digits past 999999).
  static std::string name_of(std::int64_t step) {
    char s[32];
    std::snprintf(s, sizeof s, "step-%06lld", static_cast<long long>(step));
    return s;
  }
  std::filesystem::path path_of(std::int64_t step) const { return root_ / name_of(step); }

  /// The complete checkpoints here (a step-N directory with its manifest), by step.
  std::vector<std::pair<std::int64_t, std::filesystem::path>> checkpoints() const {
    std::vector<std::pair<std::int64_t, std::filesystem::path>> out;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(root_, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) continue;
      if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }) || name.size() > 23) continue;
      if (!std::filesystem::exists(entry.path() / detail::train::json::manifest_file, ec)) continue;
      out.emplace_back(std::stoll(name.substr(5)), entry.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// The checkpoint `latest` names, or nothing before the first save. Throws checkpoint_error
  /// when `latest` names one that is not there.
  std::optional<std::filesystem::path> latest() const {
    std::error_code ec;
    if (!std::filesystem::exists(root_ / detail::train::json::latest_file, ec)) return std::nullopt;
    return detail::train::json::resolve(root_);
  }

 private:
  std::filesystem::path root_;
  int keep_;
};

/// The checkpoint the file `latest` in `root` names: what a program resumes from. Nothing when
/// nothing was saved there yet (no `root`, or no `latest` in it); checkpoint_error (missing)
/// when `latest` names a checkpoint that is not there.
inline std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root) {
  return checkpoint_directory(root).latest();
}

/// What load_checkpoint read: the checkpoint's directory and its record.
struct loaded_checkpoint {
  std::filesystem::path path;
  checkpoint_record record;
};

}  // namespace baton::train

namespace baton::detail::train {

using baton::train::checkpoint_record;
using baton::train::checkpoint_settings;
using baton::train::checkpoint_tensor;

/// The communicator of one process on its own (the one-rank model, tools).
struct solo_world {
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  template <class T>
  void all_reduce(std::span<T>, reduce_op) noexcept {}
};

/// Every rank's text, on every rank (two all-reduces of 64-bit words: any communicator that
/// reduces does).
template <class Comm>
std::vector<std::string> gather_texts(Comm& world, const std::string& mine) {
  const auto n = static_cast<std::size_t>(world.size()), me = static_cast<std::size_t>(world.rank());
  std::vector<std::int64_t> lengths(n, 0);
  lengths[me] = static_cast<std::int64_t>(mine.size());
  world.all_reduce(std::span<std::int64_t>(lengths), reduce_op::sum);
  std::vector<std::size_t> first(n + 1, 0);  // in words
  for (std::size_t r = 0; r < n; ++r) first[r + 1] = first[r] + (static_cast<std::size_t>(lengths[r]) + 7) / 8;
  std::vector<std::string> out(n);
  if (first[n] == 0) return out;
  std::vector<std::int64_t> words(first[n], 0);
  std::memcpy(words.data() + first[me], mine.data(), mine.size());
  world.all_reduce(std::span<std::int64_t>(words), reduce_op::sum);  // one rank's words per slot: exact
  for (std::size_t r = 0; r < n; ++r)
    out[r].assign(reinterpret_cast<const char*>(words.data() + first[r]), static_cast<std::size_t>(lengths[r]));
  return out;
}

/// Runs `f` on this rank and tells every rank whether it failed anywhere: the error of the
/// lowest rank that failed (prefixed with its rank where there are several), or nothing.
template <class Comm, class F>
std::optional<checkpoint_error> together(Comm& world, F&& f) {
  std::string mine;
  try {
    f();
  } catch (const checkpoint_error& e) {
    mine = std::to_string(static_cast<int>(e.problem())) + ":" + e.what();
  } catch (const std::exception& e) {  // std::filesystem_error, std::bad_alloc: the system's word
    mine = std::to_string(static_cast<int>(problem::io)) + ":" + e.what();
  }
  const std::vector<std::string> all = gather_texts(world, mine);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const auto colon = all[r].find(':');
    const auto k = static_cast<problem>(std::stoi(all[r].substr(0, colon)));
    const std::string prefix = all.size() > 1 ? "rank " + std::to_string(r) + ": " : "";
    return checkpoint_error(k, prefix + all[r].substr(colon + 1));
  }
  return std::nullopt;
}

// Rank 0, before any rank writes: DIR exists, leftovers of killed saves are gone, the
// temporary directory is new.
inline void prepare(const std::filesystem::path& root, const std::filesystem::path& tmp) {
  std::filesystem::create_directories(root);
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    const auto ends_with = [&](std::string_view s) { return name.size() > s.size() && name.ends_with(s); };
    if (name.starts_with("step-") && (ends_with(".tmp") || ends_with(".deleting"))) std::filesystem::remove_all(entry.path());
  }
  std::filesystem::create_directory(tmp);
}

// A writing rank: one file per group of its tensors; returns the files as JSON text for rank 0.
inline std::string write_rank_files(const std::filesystem::path& tmp, int rank, std::span<const checkpoint_tensor> tensors) {
  std::vector<std::string> groups;
  for (const auto& t : tensors) {
    if (t.file.empty() || !std::all_of(t.file.begin(), t.file.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        }))
      throw checkpoint_error(problem::usage, "tensor '" + t.name + "' has the file group '" + t.file +
                                                 "'; use letters, digits, '_' and '-'");
    if (std::find(groups.begin(), groups.end(), t.file) == groups.end()) groups.push_back(t.file);
  }
  json::value files = json::value::array();
  for (const std::string& group : groups) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "-%05d.safetensors", rank);
    const std::string name = group + suffix;
    std::vector<baton::train::tensor_bytes> list;
    std::vector<std::string> names;
    for (const auto& t : tensors)
      if (t.file == group) {
        list.push_back({t.name, t.dtype, t.shape, t.bytes});
        names.push_back(t.name);
      }
    const baton::train::written_file w = baton::train::write_safetensors(tmp / name, list, {{"format", "pt"}});
    files.push_back({{"name", name}, {"bytes", w.bytes}, {"xxh64", json::hex(w.xxh64)}, {"tensors", names}});
  }
  return files.dump();
}

// Rank 0, once every file is flushed: the manifest, the rename, `latest`, the old ones deleted.
inline void publish(const baton::train::checkpoint_directory& dir, const std::filesystem::path& tmp,
                    const std::filesystem::path& target, const checkpoint_record& record,
                    const std::vector<std::string>& summaries) {
  std::vector<json::file_entry> files;
  std::map<std::string, std::string> owner;  // tensor -> file
  for (const std::string& s : summaries) {
    if (s.empty()) continue;
    for (const json::value& f : json::parse(s, "a rank's list of files")) {
      json::file_entry e{f["name"].get<std::string>(), f["bytes"].get<std::uint64_t>(),
                         *json::from_hex(f["xxh64"].get<std::string>()), f["tensors"].get<std::vector<std::string>>()};
      for (const std::string& t : e.tensors)
        if (const auto [it, fresh] = owner.emplace(t, e.name); !fresh)
          throw checkpoint_error(problem::usage, "tensor '" + t + "' was written twice (" + it->second + " and " + e.name +
                                                     "): exactly one replica of each tensor may write (write_tensors)");
      files.push_back(std::move(e));
    }
  }
  {
    const std::string text = json::manifest_text(record, files);
    file_handle m = create_file(tmp / json::manifest_file);
    m.write_all(std::as_bytes(std::span<const char>(text.data(), text.size())));
    m.sync();
    m.close();
  }
  sync_directory(tmp);
  if (move_directory_into_place(tmp, target)) std::filesystem::remove_all(tmp);
  sync_directory(dir.root());
  replace_file(dir.root() / json::latest_file, target.filename().string() + "\n");
  if (dir.keep() == 0) return;
  // Best effort: a checkpoint that cannot be deleted costs space, not the save. Renamed first,
  // so that one deleted halfway is never taken for a checkpoint.
  std::vector<std::filesystem::path> older;
  for (const auto& [step, path] : dir.checkpoints())
    if (step < record.step) older.push_back(path);
  const auto kept = static_cast<std::size_t>(dir.keep() - 1);
  for (std::size_t i = 0; i + kept < older.size(); ++i) {
    std::error_code ec;
    const std::filesystem::path doomed = older[i].string() + ".deleting";
    std::filesystem::rename(older[i], doomed, ec);
    if (!ec) std::filesystem::remove_all(doomed, ec);
  }
}

inline void check_settings(const std::filesystem::path& dir, const checkpoint_settings& recorded,
                           const checkpoint_settings& expected) {
  for (const auto& [key, mine] : expected) {
    const auto it = std::find_if(recorded.begin(), recorded.end(), [&](const auto& s) { return s.first == key; });
    if (it == recorded.end())
      throw checkpoint_error(problem::other_model, "checkpoint " + quoted(dir) + " holds another kind of model: it records no setting '" +
                                                       key + "'");
    if (it->second != mine)
      throw checkpoint_error(problem::other_model, "checkpoint " + quoted(dir) + " holds another model: " + key + " is " +
                                                       it->second + " in the checkpoint but " + mine + " here");
  }
}

// Every file of the manifest is there with the size it was written with.
inline void check_present(const std::filesystem::path& dir, const json::file_entry& f) {
  const std::filesystem::path path = dir / f.name;
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(path, ec);
  if (ec)
    throw checkpoint_error(problem::missing, "checkpoint " + quoted(dir) + " is incomplete: its file " + f.name + " (" +
                                                 std::to_string(f.bytes) + " bytes in the manifest) is missing");
  if (size < f.bytes)
    throw checkpoint_error(problem::truncated, quoted(path) + " is truncated: it has " + std::to_string(size) + " bytes but " +
                                                   std::to_string(f.bytes) + " were written");
  if (size > f.bytes)
    throw checkpoint_error(problem::damaged, quoted(path) + " has " + std::to_string(size) + " bytes, more than the " +
                                                 std::to_string(f.bytes) + " written");
}

inline std::uint64_t hash_file(const std::filesystem::path& path) {
  file_handle f = open_for_reading(path);
  xxh64 h;
  std::vector<std::byte> buffer(std::size_t{1} << 20);
  for (std::uint64_t left = f.size(); left > 0;) {
    const auto chunk = std::span<std::byte>(buffer).first(static_cast<std::size_t>(std::min<std::uint64_t>(left, buffer.size())));
    if (!f.read_exact(chunk)) break;
    h.update(chunk);
    left -= chunk.size();
  }
  return h.digest();
}

inline std::string damaged_text(const std::filesystem::path& path, std::uint64_t actual, std::uint64_t recorded) {
  return quoted(path) + " is damaged: the XXH64 of its bytes is " + json::hex(actual) + " but the manifest recorded " +
         json::hex(recorded) + " when it was written (a flipped bit on the disk, or a file changed since)";
}

// Reads the tensors of `wanted` that file `f` holds, and the rest of it for its checksum.
inline void read_file(const std::filesystem::path& dir, const json::file_entry& f,
                      const std::vector<const checkpoint_tensor*>& wanted) {
  const std::filesystem::path path = dir / f.name;
  std::optional<baton::train::safetensors_file> file;
  try {
    file.emplace(path);
  } catch (const checkpoint_error& e) {
    const std::uint64_t actual = hash_file(path);
    if (actual != f.xxh64) throw checkpoint_error(problem::damaged, damaged_text(path, actual, f.xxh64) + "; " + e.what());
    throw;
  }
  std::map<std::string_view, std::span<std::byte>> into;
  for (const checkpoint_tensor* t : wanted) {
    const baton::train::safetensors_tensor* e = file->find(t->name);
    if (e == nullptr)
      throw checkpoint_error(problem::damaged, quoted(path) + " does not hold tensor '" + t->name + "', which the manifest lists in it");
    if (e->dtype != t->dtype || e->shape != t->shape)
      throw checkpoint_error(problem::other_model,
                             "checkpoint " + quoted(dir) + " holds another model: tensor '" + t->name + "' is " +
                                 std::string(to_string(e->dtype)) + " " + core::shape_text(e->shape) + " in the checkpoint but " +
                                 std::string(to_string(t->dtype)) + " " + core::shape_text(t->shape) + " here");
    into[t->name] = t->bytes;
  }
  const std::uint64_t actual = file->read([&](const baton::train::safetensors_tensor& e) {
    const auto it = into.find(e.name);
    return it == into.end() ? std::span<std::byte>{} : it->second;
  });
  if (actual != f.xxh64) throw checkpoint_error(problem::damaged, damaged_text(path, actual, f.xxh64));
}

// One rank's part of a load (see the file comment).
inline baton::train::loaded_checkpoint load_rank(const std::filesystem::path& where, const checkpoint_settings& model,
                                                 std::span<const checkpoint_tensor> tensors) {
  const std::filesystem::path dir = json::resolve(where);
  json::manifest m = json::read_manifest(dir);
  check_settings(dir, m.record.model, model);
  std::map<std::string_view, std::size_t> file_of;
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    check_present(dir, m.files[i]);
    for (const std::string& t : m.files[i].tensors)
      if (!file_of.emplace(t, i).second)
        throw checkpoint_error(problem::damaged, quoted(dir / json::manifest_file) + " lists tensor '" + t + "' twice");
  }
  std::vector<std::vector<const checkpoint_tensor*>> wanted(m.files.size());
  std::set<std::string_view> asked;
  for (const checkpoint_tensor& t : tensors) {
    if (!asked.insert(t.name).second) throw checkpoint_error(problem::usage, "load_checkpoint: tensor '" + t.name + "' is asked for twice");
    const auto it = file_of.find(t.name);
    if (it == file_of.end())
      throw checkpoint_error(problem::other_model, "checkpoint " + quoted(dir) + " holds another model: it has no tensor '" +
                                                       t.name + "' (" + std::to_string(file_of.size()) + " tensors there)");
    wanted[it->second].push_back(&t);
  }
  for (std::size_t i = 0; i < m.files.size(); ++i)
    if (!wanted[i].empty()) read_file(dir, m.files[i], wanted[i]);
  return {dir, std::move(m.record)};
}

}  // namespace baton::detail::train

namespace baton::train {

/// Saves a checkpoint of step `record.step` into `dir` (collective: every rank of `world` calls
/// it with the same record). Each rank passes the tensors it holds; those with `write_tensors`
/// write them (exactly one rank per tensor: one replica of each data- or context-parallel
/// group). Returns the checkpoint's directory once it is complete and `latest` names it. A
/// failure on any rank throws checkpoint_error on every rank, and leaves the previous
/// checkpoint and `latest` as they were.
template <class Comm>
std::filesystem::path save_checkpoint(Comm& world, const checkpoint_directory& dir, const checkpoint_record& record,
                                      std::span<const checkpoint_tensor> tensors, bool write_tensors) {
  static_assert(all_reduce_communicator<Comm>, "baton::train::save_checkpoint<Comm>: Comm must all-reduce "
                                               "(local_communicator and mpi_communicator do)");
  namespace dt = detail::train;
  std::array<std::int64_t, 2> steps{record.step, -record.step};
  world.all_reduce(std::span<std::int64_t>(steps), reduce_op::max);
  if (steps[0] != -steps[1] || record.step < 0)
    throw checkpoint_error(checkpoint_error::kind::usage,
                           "save_checkpoint: the ranks save steps " + std::to_string(-steps[1]) + " to " + std::to_string(steps[0]) +
                               "; every rank must save the same step, >= 0");
  const bool lead = world.rank() == 0;
  const std::string name = checkpoint_directory::name_of(record.step);
  const std::filesystem::path tmp = dir.root() / (name + ".tmp"), target = dir.root() / name;
  const auto fail_everywhere = [&](std::optional<checkpoint_error> e) {
    if (!e) return;
    std::error_code ec;
    if (lead) std::filesystem::remove_all(tmp, ec);
    throw checkpoint_error(e->problem(), "cannot save checkpoint " + dt::quoted(target) + ": " + e->what());
  };
  fail_everywhere(dt::together(world, [&] {
    if (lead) dt::prepare(dir.root(), tmp);
  }));
  std::string files;
  fail_everywhere(dt::together(world, [&] {
    if (write_tensors) files = dt::write_rank_files(tmp, world.rank(), tensors);
  }));
  const std::vector<std::string> summaries = dt::gather_texts(world, files);
  fail_everywhere(dt::together(world, [&] {
    if (lead) dt::publish(dir, tmp, target, record, summaries);
  }));
  return target;
}

/// save_checkpoint for one process that holds every tensor.
inline std::filesystem::path save_checkpoint(const checkpoint_directory& dir, const checkpoint_record& record,
                                             std::span<const checkpoint_tensor> tensors) {
  detail::train::solo_world solo;
  return save_checkpoint(solo, dir, record, tensors, true);
}

/// Loads a checkpoint into this rank's `tensors`, by name, from whichever files hold them
/// (collective). `where` is a checkpoint, or a directory whose `latest` names one. Refused,
/// with checkpoint_error on every rank, when `model` differs from the recorded model settings
/// (the first difference named), a file is missing, truncated or damaged, or a tensor is not
/// there or has another type or shape. On failure the tensors may hold part of the checkpoint.
template <class Comm>
loaded_checkpoint load_checkpoint(Comm& world, const std::filesystem::path& where, const checkpoint_settings& model,
                                  std::span<const checkpoint_tensor> tensors) {
  static_assert(all_reduce_communicator<Comm>, "baton::train::load_checkpoint<Comm>: Comm must all-reduce "
                                               "(local_communicator and mpi_communicator do)");
  loaded_checkpoint out;
  if (auto e = detail::train::together(world, [&] { out = detail::train::load_rank(where, model, tensors); })) throw *e;
  return out;
}

/// load_checkpoint for one process.
inline loaded_checkpoint load_checkpoint(const std::filesystem::path& where, const checkpoint_settings& model,
                                         std::span<const checkpoint_tensor> tensors) {
  detail::train::solo_world solo;
  return load_checkpoint(solo, where, model, tensors);
}

/// The record of the checkpoint `where` names, without loading a tensor: its manifest checked,
/// and every file there with its size. With `verify`, also every file read and its XXH64 and
/// safetensors header checked.
inline loaded_checkpoint read_checkpoint(const std::filesystem::path& where, bool verify = false) {
  namespace dt = detail::train;
  const std::filesystem::path dir = dt::json::resolve(where);
  dt::json::manifest m = dt::json::read_manifest(dir);
  for (const auto& f : m.files) {
    dt::check_present(dir, f);
    if (verify) dt::read_file(dir, f, {});
  }
  return {dir, std::move(m.record)};
}

}  // namespace baton::train
