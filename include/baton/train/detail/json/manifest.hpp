// baton/train/detail/json/manifest.hpp — a checkpoint's manifest.json: the format and its
// version, the record (step, data position, random states, settings), and per file its size,
// XXH64 and tensors. The manifest checks itself: its last key is the XXH64 of the text before
// it (as nlohmann writes it), so a flipped byte in it is found like one in a tensor file. And
// the way from what a user names (a checkpoint, or a directory whose `latest` names one) to
// the checkpoint's directory.
#pragma once

#include <baton/train/checkpoint_error.hpp>
#include <baton/train/checkpoint_state.hpp>
#include <baton/train/detail/checkpoint_files.hpp>
#include <baton/train/detail/json/support.hpp>
#include <baton/train/detail/xxh64.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace baton::detail::train::json {

inline constexpr std::string_view manifest_file = "manifest.json";
inline constexpr std::string_view latest_file = "latest";
inline constexpr std::string_view format_name = "baton-checkpoint";
inline constexpr std::int64_t format_version = 1;

/// One file of a checkpoint as its manifest lists it.
struct file_entry {
  std::string name;  // relative to the checkpoint's directory
  std::uint64_t bytes = 0;
  std::uint64_t xxh64 = 0;
  std::vector<std::string> tensors;
};

struct manifest {
  baton::train::checkpoint_record record;
  std::vector<file_entry> files;
};

inline std::string hex(std::uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

inline std::optional<std::uint64_t> from_hex(std::string_view s) {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<std::uint64_t>(d);
  }
  return v;
}

inline value settings_json(const baton::train::checkpoint_settings& settings) {
  value v = value::object();
  for (const auto& [k, x] : settings) v[k] = x;
  return v;
}

inline value strings_json(const std::map<std::string, std::string>& m) {
  value v = value::object();
  for (const auto& [k, x] : m) v[k] = x;
  return v;
}

/// The manifest's text: the record, the files, and last the XXH64 of everything before it.
inline std::string manifest_text(const baton::train::checkpoint_record& r, const std::vector<file_entry>& files) {
  value m = value::object();
  m["format"] = format_name;
  m["version"] = format_version;
  m["step"] = r.step;
  m["data_position"] = r.data_position;
  m["random_states"] = strings_json(r.random_states);
  m["metadata"] = strings_json(r.metadata);
  m["model"] = settings_json(r.model);
  m["training"] = settings_json(r.training);
  m["mesh"] = settings_json(r.mesh);
  value list = value::array();
  for (const file_entry& f : files)
    list.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", hex(f.xxh64)}, {"tensors", f.tensors}});
  m["files"] = std::move(list);
  const std::string body = m.dump(2);
  m["manifest_xxh64"] = hex(xxh64::of(std::as_bytes(std::span<const char>(body.data(), body.size()))));
  return m.dump(2) + "\n";
}

inline std::string read_text_file(const std::filesystem::path& p) {
  file_handle f = open_for_reading(p);
  std::string text(static_cast<std::size_t>(f.size()), '\0');
  if (!f.read_exact(std::as_writable_bytes(std::span<char>(text.data(), text.size()))))
    throw checkpoint_error(problem::truncated, quoted(p) + " became shorter while it was read");
  return text;
}

/// Reads and checks `dir`/manifest.json.
inline manifest read_manifest(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / manifest_file;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw checkpoint_error(problem::missing, "checkpoint " + quoted(dir) + " has no " + std::string(manifest_file));
  const std::string where = quoted(path);
  value m = parse(read_text_file(path), where);
  const auto damaged = [&](const std::string& what) { return checkpoint_error(problem::damaged, where + ": " + what); };
  if (!m.is_object() || !m.contains("format") || m["format"] != format_name)
    throw damaged("not a baton checkpoint manifest (no \"format\": \"" + std::string(format_name) + "\")");
  if (!m.contains("manifest_xxh64")) throw damaged("the manifest's own checksum (manifest_xxh64) is missing");
  const std::optional<std::uint64_t> recorded = from_hex(text_of(m["manifest_xxh64"], where + ": manifest_xxh64"));
  m.erase("manifest_xxh64");
  const std::string body = m.dump(2);
  const std::uint64_t actual = xxh64::of(std::as_bytes(std::span<const char>(body.data(), body.size())));
  if (!recorded || *recorded != actual)
    throw damaged("the manifest is damaged: its contents do not match its own checksum (manifest_xxh64)");
  if (!m.contains("version") || !m["version"].is_number_integer() || m["version"].get<std::int64_t>() != format_version)
    throw damaged("format version " + (m.contains("version") ? m["version"].dump() : std::string("(none)")) +
                  "; this baton reads version " + std::to_string(format_version));
  const auto integer = [&](const char* key) {
    if (!m.contains(key) || !m[key].is_number_integer()) throw damaged(std::string(key) + " is not an integer");
    return m[key].get<std::int64_t>();
  };
  const auto strings = [&](const char* key) {
    std::map<std::string, std::string> out;
    if (!m.contains(key) || !m[key].is_object()) throw damaged(std::string(key) + " is not an object");
    for (const auto& [k, v] : m[key].items()) out[k] = text_of(v, where + ": " + key + "." + k);
    return out;
  };
  const auto settings = [&](const char* key) {
    baton::train::checkpoint_settings out;
    if (!m.contains(key) || !m[key].is_object()) throw damaged(std::string(key) + " is not an object");
    for (const auto& [k, v] : m[key].items()) out.emplace_back(k, text_of(v, where + ": " + key + "." + k));
    return out;
  };
  manifest out;
  out.record.step = integer("step");
  out.record.data_position = integer("data_position");
  out.record.random_states = strings("random_states");
  out.record.metadata = strings("metadata");
  out.record.model = settings("model");
  out.record.training = settings("training");
  out.record.mesh = settings("mesh");
  if (!m.contains("files") || !m["files"].is_array()) throw damaged("files is not a list");
  for (const value& f : m["files"]) {
    file_entry e;
    if (!f.is_object() || !f.contains("name") || !f.contains("bytes") || !f.contains("xxh64") || !f.contains("tensors") ||
        !f["tensors"].is_array())
      throw damaged("an entry of files lacks name, bytes, xxh64 or tensors");
    e.name = text_of(f["name"], where + ": a file's name");
    if (e.name.empty() || e.name.find('/') != std::string::npos || e.name == "." || e.name == "..")
      throw damaged("the file name '" + e.name + "' is not a plain name");
    e.bytes = count_of(f["bytes"], where + ": the size of " + e.name);
    const auto x = from_hex(text_of(f["xxh64"], where + ": the checksum of " + e.name));
    if (!x) throw damaged("the checksum of " + e.name + " is not 16 hex digits");
    e.xxh64 = *x;
    for (const value& t : f["tensors"]) e.tensors.push_back(text_of(t, where + ": a tensor name of " + e.name));
    out.files.push_back(std::move(e));
  }
  return out;
}

/// The checkpoint `where` names: `where` itself when it holds a manifest, else the one its
/// file `latest` names.
inline std::filesystem::path resolve(const std::filesystem::path& where) {
  std::error_code ec;
  if (!std::filesystem::is_directory(where, ec))
    throw checkpoint_error(problem::missing, "no checkpoint at " + quoted(where) + ": there is no such directory");
  if (std::filesystem::exists(where / manifest_file, ec)) return where;
  const std::filesystem::path latest = where / latest_file;
  if (!std::filesystem::exists(latest, ec))
    throw checkpoint_error(problem::missing, "no checkpoint in " + quoted(where) + ": it holds neither a " +
                                                 std::string(manifest_file) + " (a checkpoint) nor a file '" +
                                                 std::string(latest_file) + "' (a directory of checkpoints)");
  std::string name = read_text_file(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw checkpoint_error(problem::damaged, quoted(latest) + " does not name a checkpoint (it holds '" + name + "')");
  const std::filesystem::path dir = where / name;
  if (!std::filesystem::exists(dir / manifest_file, ec))
    throw checkpoint_error(problem::missing, quoted(latest) + " names " + name + ", but " + quoted(dir) +
                                                 " is not a complete checkpoint (no " + std::string(manifest_file) + ")");
  return dir;
}

}  // namespace baton::detail::train::json
