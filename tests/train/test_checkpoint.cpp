// Checkpoints (baton/train/json/): the safetensors format and its reader's refusals, XXH64,
// exact resume on every mesh of issue 28 (bit for bit, float and double), resharding to other
// meshes and to one rank against the one-rank model, atomicity (a save killed with SIGKILL at
// any moment), verification (a truncated file, a flipped byte, a missing file, another model),
// `keep`, and the examples of docs/training.md and lm_checkpoint.hpp's comment. Ranks are
// threads of the local world; assertions run on the main thread.
#include "checkpoint_support.hpp"

#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/config.hpp>
#include <baton/schedule.hpp>
#include <baton/train.hpp>
#include <baton/train/detail/xxh64.hpp>

#include "catch.hpp"
#include "skip.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

TEST_CASE("checkpoint: XXH64 gives the published values, in one piece or many", "[checkpoint][xxh64]") {
  using baton::detail::train::xxh64;
  const auto of = [](std::string_view s) { return xxh64::of(std::as_bytes(std::span<const char>(s.data(), s.size()))); };
  // The reference implementation's values (xxhsum -H1; the python-xxhash README's example).
  CHECK(of("") == 0xEF46DB3751D8E999ULL);
  CHECK(of("a") == 0xD24EC4F1A98C6E5BULL);
  CHECK(of("abc") == 0x44BC2CF5AD770999ULL);
  CHECK(of("Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1ULL);
  // Streaming: any cut of the input gives the one-piece hash (stripes of 32 bytes cross cuts).
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>((i * 131 + 7) % 251);
  const std::uint64_t whole = of(text);
  for (std::size_t cut : {1u, 7u, 31u, 32u, 33u, 64u, 100u, 999u}) {
    xxh64 h;
    for (std::size_t at = 0; at < text.size(); at += cut)
      h.update(std::as_bytes(std::span<const char>(text.data() + at, std::min(cut, text.size() - at))));
    CHECK(h.digest() == whole);
  }
}

TEST_CASE("checkpoint: any_rank turns one rank's flag into every rank's decision; random states as text",
          "[checkpoint][signal]") {
  // A signal handler's flag seen on one rank only (or on none): every rank gets the same answer.
  for (int flagged : {-1, 0, 2}) {
    const auto answers = baton::run_local(3, [&](baton::local_communicator& world) {
      return baton::train::any_rank(world, world.rank() == flagged);
    });
    INFO("flag on rank " << flagged);
    CHECK(answers == std::vector<bool>(3, flagged >= 0));
  }
  std::mt19937_64 engine(7);
  engine.discard(3);
  const std::string state = baton::train::random_state_text(engine);
  const std::uint64_t next = engine();
  std::mt19937_64 other(99);
  baton::train::restore_random_state(state, other);
  CHECK(other() == next);
  try {
    baton::train::restore_random_state("not a state", other, "random state 'shuffle'");
    FAIL("a text that is no engine state was accepted");
  } catch (const baton::train::checkpoint_error& e) {
    CHECK(e.problem() == baton::train::checkpoint_error::kind::damaged);
    CHECK(std::string(e.what()) == "the checkpoint's random state 'shuffle' is not a state of this engine");
  }
}

// Without nlohmann-json there are no checkpoints: this case says so (its own ctest entry), and
// every other case below is compiled only with it.
TEST_CASE("checkpoint: the manifest records the run, and each file's size and XXH64", "[checkpoint][manifest][can-skip]") {
#if !BATON_HAS_JSON()
  BATON_SKIP("checkpoints need nlohmann-json: link baton::json (Debian: apt-get install nlohmann-json3-dev)");
#else
  using namespace checkpoint_test;
  scratch_dir dir("manifest");
  train::lm_config config = small_config<double>();
  train::lm_reference<double, baton::reference_attention> model(config);
  for (int s = 0; s < 3; ++s) model.step(corpus().train_batch(s, 4, 16, false));
  const fs::path where = train::save_checkpoint(model, train::checkpoint_directory(dir.path()), {.data_position = 7});
  CHECK(where == dir.path() / "step-000003");
  const train::loaded_checkpoint read = train::read_checkpoint(dir.path(), /*verify=*/true);
  CHECK(read.path == where);
  CHECK(read.record.step == 3);
  CHECK(read.record.data_position == 7);
  CHECK(read.record.random_states.at("nn.initializer.seed") == "5");
  const train::checkpoint_settings model_settings{{"layers", "4"}, {"d_model", "16"},     {"heads", "4"},
                                                  {"kv_heads", "2"}, {"head_dim", "4"},   {"ffn_hidden", "64"},
                                                  {"vocab", "256"}, {"qkv_bias", "false"}, {"rope_base", "10000"},
                                                  {"norm_eps", "1e-05"}, {"dtype", "F64"}};
  CHECK(read.record.model == model_settings);
  CHECK(read.record.training.front() == std::pair<std::string, std::string>{"seq", "16"});
  CHECK(read.record.training[2] == std::pair<std::string, std::string>{"lr", "0.01"});  // as written, no noise digits
  // The manifest as a file: each entry's size and XXH64 are those of the file's bytes.
  std::ifstream in(where / "manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  CHECK(manifest["format"] == "baton-checkpoint");
  CHECK(manifest["version"] == 1);
  REQUIRE(manifest["files"].size() == 2);
  for (const auto& entry : manifest["files"]) {
    const std::string name = entry["name"];
    std::ifstream f(where / name, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), {});
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx",
                  static_cast<unsigned long long>(baton::detail::train::xxh64::of(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())))));
    INFO(name);
    CHECK((name == "model-00000.safetensors" || name == "optimizer-00000.safetensors"));
    CHECK(entry["bytes"] == bytes.size());
    CHECK(entry["xxh64"] == hex);
  }
  CHECK(manifest["files"][1]["tensors"][0] == "embed.weight.exp_avg");
#endif
}

#if BATON_HAS_JSON()

namespace {

using namespace checkpoint_test;
using baton::reference_attention;
using kind = train::checkpoint_error::kind;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// The kind and message of the checkpoint_error `f` throws (kind::usage and "" when none).
template <class F>
std::pair<kind, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const train::checkpoint_error& e) {
    return {e.problem(), e.what()};
  }
  return {kind::usage, ""};
}

std::span<const std::byte> bytes_of(const std::vector<double>& v) { return std::as_bytes(std::span<const double>(v)); }

}  // namespace

TEST_CASE("checkpoint: a safetensors file is laid out as the format says and reads back", "[checkpoint][safetensors]") {
  scratch_dir dir("safetensors");
  const fs::path path = dir.path() / "t.safetensors";
  const std::vector<double> a{1.5, -2.25, 3.0, 1e-300, -0.0, 7.0};
  const std::vector<float> b{0.5f, 0.25f};
  const std::vector<std::int64_t> c{-1, 1LL << 40, 3};
  const std::vector<train::tensor_bytes> tensors{
      {"layer.a", train::tensor_dtype::F64, {2, 3}, bytes_of(a)},
      {"b", train::tensor_dtype::F32, {2}, std::as_bytes(std::span<const float>(b))},
      {"empty", train::tensor_dtype::F32, {0, 4}, {}},
      {"c", train::tensor_dtype::I64, {3, 1}, std::as_bytes(std::span<const std::int64_t>(c))},
  };
  const train::written_file w = train::write_safetensors(path, tensors, {{"format", "pt"}, {"note", "ünïcode"}});
  const std::string bytes = read_file(path);
  REQUIRE(bytes.size() == w.bytes);
  CHECK(w.xxh64 == baton::detail::train::xxh64::of(std::as_bytes(std::span<const char>(bytes.data(), bytes.size()))));
  // The layout, read by hand: N little-endian, N % 8 == 0, '{' first, space padding, the data
  // back to back in the order given.
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)])) << (8 * i);
  CHECK(n % 8 == 0);
  CHECK(bytes[8] == '{');
  CHECK(bytes.size() == 8 + n + 48 + 8 + 0 + 24);
  CHECK(std::memcmp(bytes.data() + 8 + n, a.data(), 48) == 0);
  CHECK(std::memcmp(bytes.data() + 8 + n + 48, b.data(), 8) == 0);
  CHECK(std::memcmp(bytes.data() + 8 + n + 56, c.data(), 24) == 0);
  const std::string header = bytes.substr(8, n);
  CHECK(header.find(R"("layer.a":{"dtype":"F64","shape":[2,3],"data_offsets":[0,48]})") != std::string::npos);
  CHECK(header.find(R"("empty":{"dtype":"F32","shape":[0,4],"data_offsets":[56,56]})") != std::string::npos);

  train::safetensors_file f(path);
  REQUIRE(f.tensors().size() == 4);
  CHECK(f.metadata().at("note") == "ünïcode");
  CHECK(f.find("c")->shape == std::vector<std::int64_t>{3, 1});
  const auto back = f.load<double>("layer.a");
  CHECK(std::memcmp(back.data(), a.data(), 48) == 0);
  CHECK(f.load<std::int64_t>("c")[1] == (1LL << 40));
  std::vector<float> into(2);
  const std::uint64_t h = f.read([&](const train::safetensors_tensor& t) {
    return t.name == "b" ? std::as_writable_bytes(std::span<float>(into)) : std::span<std::byte>{};
  });
  CHECK(h == w.xxh64);
  CHECK(into == b);
  CHECK(error_of([&] { (void)f.load<float>("layer.a"); }).second.find("is F64, not F32") != std::string::npos);

  // A file of 8 MiB of data or more is hashed on a second thread while it is written: the
  // same XXH64 as the file's bytes, and the same layout.
  std::vector<double> large(std::size_t{9} << 17);  // 9 MiB
  for (std::size_t i = 0; i < large.size(); ++i) large[i] = static_cast<double>(i % 1013) * 0.5 - 7;
  const std::vector<train::tensor_bytes> large_tensors{{"small", train::tensor_dtype::F32, {2}, std::as_bytes(std::span<const float>(b))},
                                                       {"large", train::tensor_dtype::F64, {9, 1 << 17}, bytes_of(large)}};
  const fs::path large_path = dir.path() / "large.safetensors";
  const train::written_file lw = train::write_safetensors(large_path, large_tensors);
  const std::string large_bytes = read_file(large_path);
  REQUIRE(large_bytes.size() == lw.bytes);
  CHECK(lw.xxh64 == baton::detail::train::xxh64::of(std::as_bytes(std::span<const char>(large_bytes.data(), large_bytes.size()))));
  CHECK(train::safetensors_file(large_path).load<double>("large")[(9 << 17) - 1] == large.back());

  // Writing refuses what the format cannot hold.
  const std::vector<train::tensor_bytes> twice{{"x", train::tensor_dtype::F32, {2}, std::as_bytes(std::span<const float>(b))},
                                               {"x", train::tensor_dtype::F32, {2}, std::as_bytes(std::span<const float>(b))}};
  CHECK(error_of([&] { train::write_safetensors(path, twice); }).second.find("'x' is given twice") != std::string::npos);
  const std::vector<train::tensor_bytes> short_bytes{{"x", train::tensor_dtype::F64, {2}, std::as_bytes(std::span<const float>(b))}};
  CHECK(error_of([&] { train::write_safetensors(path, short_bytes); }).second.find("needs 16 bytes but 8 are given") !=
        std::string::npos);
}

TEST_CASE("checkpoint: the safetensors reader refuses every broken rule, naming the file and the rule",
          "[checkpoint][safetensors]") {
  scratch_dir dir("bad_safetensors");
  const fs::path path = dir.path() / "bad.safetensors";
  // A file of the given header (padded to 8) and data bytes.
  const auto file = [&](std::string header, std::size_t data) {
    std::string s(8, '\0');
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    s += header + std::string(data, '\x01');
    write_file(path, s);
  };
  struct bad {
    std::string header;
    std::size_t data;
    kind expected;
    std::string needle;
  };
  const std::vector<bad> cases{
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, kind::truncated, "ends at byte 8 of the data but the file holds only 4"},
      {R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8, kind::damaged, "unknown dtype \"F33\""},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, kind::damaged, "is not a list of non-negative integers"},
      {R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20, kind::damaged, "needs 24 bytes but its data_offsets [0,20] hold 20"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, kind::damaged, "end before they begin"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
       kind::damaged, "tensors 'a' and 'b' overlap"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, kind::damaged, "the data bytes [0, 4) belong to no tensor"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, kind::damaged, "the data bytes [4, 8) belong to no tensor"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
       kind::damaged, "gives the key 'a' twice"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"stride":[1]}})", 4, kind::damaged, "has an unknown field 'stride'"},
      {R"({"a":{"dtype":"F32","shape":[1]}})", 4, kind::damaged, "lacks one of dtype, shape, data_offsets"},
      {R"({"__metadata__":{"k":1}})", 0, kind::damaged, "__metadata__ 'k' is not a string"},
      {R"({"a":{"dtype":"F32",)", 0, kind::damaged, "is not valid JSON"},
      {R"([1,2])", 0, kind::damaged, "does not start with '{'"},
  };
  for (const bad& b : cases) {
    file(b.header, b.data);
    const auto [k, message] = error_of([&] { train::safetensors_file f(path); });
    INFO(b.header << " -> " << message);
    CHECK(k == b.expected);
    CHECK(message.find(b.needle) != std::string::npos);
    CHECK(message.find(path.string()) != std::string::npos);
  }
  // Lengths that do not fit the file.
  write_file(path, "12345");
  CHECK(error_of([&] { train::safetensors_file f(path); }).second.find("fewer than the 8 of the header length") != std::string::npos);
  write_file(path, std::string("\x40\0\0\0\0\0\0\0{}", 10));
  const auto [k, message] = error_of([&] { train::safetensors_file f(path); });
  CHECK(k == kind::truncated);
  CHECK(message.find("header length is 64 bytes but only 2 bytes follow") != std::string::npos);
  write_file(path, std::string("\xff\xff\xff\xff\0\0\0\0{}", 10));
  CHECK(error_of([&] { train::safetensors_file f(path); }).second.find("over the format's limit") != std::string::npos);
}

TEMPLATE_TEST_CASE("checkpoint: train N, save, resume, train M equals N + M steps bit for bit (threads)",
                   "[checkpoint][resume]", double, float) {
  using T = TestType;
  for (const mesh_case& mesh : resume_meshes()) {
    scratch_dir dir("resume");
    const auto outcomes = baton::run_local(mesh.parallelism.mesh.size(), [&](baton::local_communicator& world) {
      return train_save_resume<T, reference_attention>(world, mesh, dir.path(), 2, 2);
    });
    for (std::size_t r = 0; r < outcomes.size(); ++r) {
      const auto& o = outcomes[r];
      INFO(mesh.name << ", rank " << r);
      CHECK(o.saved == dir.path() / "step-000002");
      CHECK(o.steps_after_load == 2);
      CHECK(o.data_position == 2);
      CHECK(o.changed.empty());
      CHECK(o.resumed_losses == o.straight_losses);  // exact
      CHECK(first_bitwise_difference(o.straight, o.resumed).empty());
    }
    // Training moved the model between the save and the end (the comparison is not of two
    // copies of the saved state).
    CHECK(outcomes[0].straight_losses[0] != outcomes[0].straight_losses[1]);
  }
}

TEST_CASE("checkpoint: written on pp2 x cp2 (ZBV, ring), resumed on pp4, dp2 x cp2 Ulysses and one rank like the one-rank model",
          "[checkpoint][reshard]") {
  using T = double;
  using baton::shard_layout;
  using baton::nn::cp_mode;
  scratch_dir dir("reshard");
  const train::lm_config config = small_config<T>();
  const auto batch = [&](std::int64_t step) { return corpus().train_batch(step, 4, config.seq, false); };  // 4 rows
  const int n = 2, m = 2;
  // Saved on pp2 x cp2 after n steps; its parameters then.
  // It also trains on, uninterrupted: an oracle for the oracle, which shares no loading code.
  struct writer {
    parameters<T> at_save, after;
    std::vector<double> losses;
  };
  const auto saved = baton::run_local(4, [&](baton::local_communicator& world) {
    train::lm_trainer<T, baton::local_communicator, reference_attention> a(
        world, config, {{.pp = 2, .cp_ring = 2}, cp_mode::ring, shard_layout::zigzag}, schedule_of<baton::zbv>(2));
    for (int s = 0; s < n; ++s) a.step(batch(s));
    train::save_checkpoint(a, train::checkpoint_directory(dir.path()));
    writer w;
    w.at_save = a.parameters();
    for (int s = n; s < n + m; ++s) w.losses.push_back(a.step(batch(s)).loss);
    w.after = a.parameters();
    return w;
  });

  // The oracle: the one-rank model resumed from the same checkpoint.
  train::lm_config other = config;
  other.seed = 999;
  train::lm_reference<T, reference_attention> oracle(other);
  const auto info = train::load_checkpoint(oracle, dir.path());
  CHECK(info.step == n);
  CHECK(oracle.steps() == n);  // AdamW's bias corrections continue from step n
  CHECK(first_bitwise_difference(oracle.parameters(), saved[0].at_save).empty());  // loaded exactly as saved
  const parameters<T> at_save = oracle.parameters();
  std::vector<double> oracle_losses;
  for (int s = n; s < n + m; ++s) oracle_losses.push_back(oracle.step(batch(s)).loss);
  const parameters<T> expected = oracle.parameters();
  // The resumed oracle continues like the writer that never stopped (1e-10: another order of
  // sums), so a state the load missed (moments, step count) cannot hide in both.
  for (std::size_t s = 0; s < oracle_losses.size(); ++s)
    CHECK(std::abs(saved[0].losses[s] - oracle_losses[s]) <= 1e-10 * oracle_losses[s]);
  {
    double worst = 0, largest = 0;
    for (const auto& [name, x] : expected)
      for (std::int64_t i = 0; i < x.size(); ++i) {
        worst = std::max(worst, std::abs(saved[0].after.at(name)[i] - x[i]));
        largest = std::max(largest, std::abs(x[i]));
      }
    INFO("the uninterrupted writer against the resumed oracle: " << worst / largest);
    CHECK(worst <= 1e-10 * largest);
  }

  struct target {
    std::string name;
    train::lm_parallelism parallelism;
    baton::program schedule;
    std::int64_t batch;  // rows per replica: the global batch stays 4 rows
  };
  const std::vector<target> targets{
      {"pp4 1F1B", {{.pp = 4}, cp_mode::none, shard_layout::zigzag}, schedule_of<baton::one_f_one_b>(4), 4},
      {"dp2 x cp2 Ulysses", {{.pp = 1, .dp = 2, .cp_ulysses = 2}, cp_mode::ulysses, shard_layout::contiguous},
       schedule_of<baton::gpipe>(1, 2), 2},
      {"one rank", {{}, cp_mode::none, shard_layout::zigzag}, schedule_of<baton::gpipe>(1), 4},
  };
  for (const target& t : targets) {
    train::lm_config c = other;
    c.batch = t.batch;
    struct result {
      std::vector<double> losses;
      parameters<T> params;
      std::vector<std::string> changed;
    };
    const auto results = baton::run_local(t.parallelism.mesh.size(), [&](baton::local_communicator& world) {
      train::lm_trainer<T, baton::local_communicator, reference_attention> b(world, c, t.parallelism, t.schedule);
      const auto loaded = train::load_checkpoint(b, dir.path());
      result r;
      r.changed = loaded.changed;
      for (std::int64_t s = loaded.data_position; s < n + m; ++s) r.losses.push_back(b.step(batch(s)).loss);
      r.params = b.parameters();
      return r;
    });
    // 1e-10 relative: the meshes sum the same terms in other orders (test_train.cpp's bound).
    double worst = 0, largest = 0, moved = 0;
    for (const auto& [name, x] : expected)
      for (std::int64_t i = 0; i < x.size(); ++i) {
        worst = std::max(worst, std::abs(results[0].params.at(name)[i] - x[i]));
        largest = std::max(largest, std::abs(x[i]));
        moved = std::max(moved, std::abs(x[i] - at_save.at(name)[i]));
      }
    INFO(t.name << ": worst parameter difference " << worst / largest << ", training moved them by " << moved / largest);
    CHECK(worst <= 1e-10 * largest);
    CHECK(moved > 1e-4 * largest);
    for (const auto& r : results) {
      REQUIRE(r.losses.size() == oracle_losses.size());
      for (std::size_t s = 0; s < r.losses.size(); ++s) CHECK(std::abs(r.losses[s] - oracle_losses[s]) <= 1e-10 * oracle_losses[s]);
    }
    if (t.batch != config.batch) {  // the batch per replica changed (the global batch did not): reported, allowed
      REQUIRE(results[0].changed.size() == 1);
      CHECK(results[0].changed[0] == "batch: 4 in the checkpoint, 2 now");
    } else {
      CHECK(results[0].changed.empty());
    }
  }
}

namespace {

// A trained one-rank model's checkpoint (double), for the fault cases to damage copies of.
struct saved_model {
  scratch_dir dir{"faults"};
  fs::path checkpoint;
  saved_model() {
    train::lm_reference<double, reference_attention> model(small_config<double>());
    model.step(corpus().train_batch(0, 4, 16, false));
    checkpoint = train::save_checkpoint(model, train::checkpoint_directory(dir.path()));
  }
};

std::pair<kind, std::string> load_error(const fs::path& where, const train::lm_config& config) {
  train::lm_reference<double, reference_attention> model(config);
  return error_of([&] { train::load_checkpoint(model, where); });
}

void flip_byte(const fs::path& p, std::uint64_t at) {
  std::string bytes = read_file(p);
  bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
  write_file(p, bytes);
}

}  // namespace

TEST_CASE("checkpoint: a truncated file, a flipped byte, a missing file and another model each have their message",
          "[checkpoint][faults]") {
  const train::lm_config config = small_config<double>();
  saved_model s;
  const fs::path model_file = s.checkpoint / "model-00000.safetensors";
  const fs::path optimizer_file = s.checkpoint / "optimizer-00000.safetensors";
  REQUIRE(fs::exists(model_file));
  REQUIRE(load_error(s.dir.path(), config).second.empty());  // the intact one loads
  const std::string original = read_file(model_file);

  SECTION("truncated") {
    write_file(model_file, original.substr(0, original.size() - 100));
    const auto [k, message] = load_error(s.dir.path(), config);
    CHECK(k == kind::truncated);
    CHECK(message.find(model_file.string() + "' is truncated: it has " + std::to_string(original.size() - 100) + " bytes but " +
                       std::to_string(original.size()) + " were written") != std::string::npos);
  }
  SECTION("a flipped byte in the data") {
    flip_byte(model_file, original.size() - 3);
    const auto [k, message] = load_error(s.dir.path(), config);
    CHECK(k == kind::damaged);
    CHECK(message.find(model_file.string() + "' is damaged: the XXH64 of its bytes is") != std::string::npos);
  }
  SECTION("a flipped byte in the header") {
    flip_byte(model_file, 20);
    const auto [k, message] = load_error(s.dir.path(), config);
    CHECK(k == kind::damaged);
    CHECK(message.find(model_file.string() + "' is damaged") != std::string::npos);
  }
  SECTION("a flipped byte in the manifest") {
    flip_byte(s.checkpoint / "manifest.json", 40);
    const auto [k, message] = load_error(s.dir.path(), config);
    CHECK(k == kind::damaged);
    CHECK(message.find("manifest.json'") != std::string::npos);
  }
  SECTION("a missing file") {
    fs::remove(optimizer_file);
    const auto [k, message] = load_error(s.dir.path(), config);
    CHECK(k == kind::missing);
    CHECK(message.find("is incomplete: its file optimizer-00000.safetensors") != std::string::npos);
    CHECK(message.find("is missing") != std::string::npos);
    CHECK(error_of([&] { (void)train::check_lm_checkpoint<double>(s.dir.path(), config); }).second == message);
  }
  SECTION("another model: the first differing setting is named") {
    train::lm_config layers = config;
    layers.layers = 8;
    auto [k, message] = load_error(s.dir.path(), layers);
    CHECK(k == kind::other_model);
    CHECK(message.find("holds another model: layers is 4 in the checkpoint but 8 here") != std::string::npos);
    train::lm_config width = config;
    width.model.d_model = 32;
    message = load_error(s.dir.path(), width).second;
    CHECK(message.find("holds another model: d_model is 16 in the checkpoint but 32 here") != std::string::npos);
    train::lm_config vocab = config;
    vocab.model.vocab = 300;
    message = load_error(s.dir.path(), vocab).second;
    CHECK(message.find("vocab is 256 in the checkpoint but 300 here") != std::string::npos);
    train::lm_reference<float, reference_attention> single(small_config<float>());
    message = error_of([&] { train::load_checkpoint(single, s.dir.path()); }).second;
    CHECK(message.find("dtype is F64 in the checkpoint but F32 here") != std::string::npos);
    // The same answer before any trainer exists (a program's check of --resume).
    std::tie(k, message) = error_of([&] { (void)train::check_lm_checkpoint<double>(s.dir.path(), layers); });
    CHECK(k == kind::other_model);
    CHECK(message.find("holds another model: layers is 4 in the checkpoint but 8 here") != std::string::npos);
    CHECK(error_of([&] { (void)train::check_lm_checkpoint<float>(s.dir.path(), config); }).second.find("dtype is F64") !=
          std::string::npos);
    CHECK(train::check_lm_checkpoint<double>(s.dir.path(), config).record.step == 1);
  }
  SECTION("no checkpoint, and `latest` naming one that is gone") {
    scratch_dir empty("empty");
    auto [k, message] = load_error(empty.path(), config);
    CHECK(k == kind::missing);
    CHECK(message.find("no checkpoint in '" + empty.path().string() + "'") != std::string::npos);
    fs::remove_all(s.checkpoint);
    std::tie(k, message) = load_error(s.dir.path(), config);
    CHECK(k == kind::missing);
    CHECK(message.find("latest' names step-000001, but") != std::string::npos);
  }
}

TEST_CASE("checkpoint: a fault on some ranks is thrown on every rank; a failed save leaves the last checkpoint",
          "[checkpoint][faults]") {
  using baton::shard_layout;
  using baton::nn::cp_mode;
  scratch_dir dir("faults_mesh");
  const train::lm_config config = small_config<double>();
  const mesh_case mesh = resume_meshes()[0];  // ZBV pp2 x cp2: ranks 0 and 2 write
  const auto batch = [&](std::int64_t s) { return corpus().train_batch(s, 4, config.seq, false); };
  baton::run_local(4, [&](baton::local_communicator& world) {
    train::lm_trainer<double, baton::local_communicator, reference_attention> a(world, config, mesh.parallelism, mesh.schedule);
    a.step(batch(0));
    train::save_checkpoint(a, train::checkpoint_directory(dir.path()));
  });
  // Rank 2's model file holds the stages of pipeline rank 1, which only ranks 2 and 3 read.
  const fs::path damaged = dir.path() / "step-000001" / "model-00002.safetensors";
  REQUIRE(fs::exists(damaged));
  flip_byte(damaged, fs::file_size(damaged) - 5);
  const auto errors = baton::run_local(4, [&](baton::local_communicator& world) {
    train::lm_trainer<double, baton::local_communicator, reference_attention> b(world, config, mesh.parallelism, mesh.schedule);
    return error_of([&] { train::load_checkpoint(b, dir.path()); });
  });
  for (const auto& [k, message] : errors) {
    CHECK(k == kind::damaged);
    CHECK(message.find("rank 2: '" + damaged.string() + "' is damaged") != std::string::npos);
  }

  // A save that fails on one rank (a file group the format cannot name) fails on every rank
  // and leaves `latest` and the checkpoint it names as they were.
  const std::string latest_before = read_file(dir.path() / "latest");
  const auto failures = baton::run_local(2, [&](baton::local_communicator& world) {
    std::vector<double> values(4, 1.0 + world.rank());
    std::vector<train::checkpoint_tensor> mine{{"t" + std::to_string(world.rank()), world.rank() == 1 ? "bad/group" : "model",
                                                train::tensor_dtype::F64, {4}, std::as_writable_bytes(std::span<double>(values))}};
    train::checkpoint_record record;
    record.step = 7;
    return error_of([&] { train::save_checkpoint(world, train::checkpoint_directory(dir.path()), record, mine, true); });
  });
  for (const auto& [k, message] : failures) {
    CHECK(k == kind::usage);
    CHECK(message.find("rank 1: tensor 't1' has the file group 'bad/group'") != std::string::npos);
  }
  CHECK(read_file(dir.path() / "latest") == latest_before);
  CHECK(!fs::exists(dir.path() / "step-000007.tmp"));
  CHECK(!fs::exists(dir.path() / "step-000007"));
  CHECK(train::read_checkpoint(dir.path()).record.step == 1);
}

TEST_CASE("checkpoint: keep K deletes the older ones; the same step saved again replaces it", "[checkpoint][keep]") {
  scratch_dir dir("keep");
  std::vector<double> values(8);
  const std::vector<train::checkpoint_tensor> tensors{
      {"w", "model", train::tensor_dtype::F64, {8}, std::as_writable_bytes(std::span<double>(values))}};
  const train::checkpoint_directory d(dir.path(), /*keep=*/2);
  for (std::int64_t step = 1; step <= 5; ++step) {
    std::fill(values.begin(), values.end(), static_cast<double>(step));
    train::checkpoint_record r;
    r.step = step;
    r.data_position = 10 * step;
    train::save_checkpoint(d, r, tensors);
  }
  const auto kept = d.checkpoints();
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].first == 4);
  CHECK(kept[1].first == 5);
  CHECK(d.latest() == dir.path() / "step-000005");
  CHECK(train::latest_checkpoint(dir.path()) == dir.path() / "step-000005");
  CHECK(!train::latest_checkpoint(dir.path() / "never-saved").has_value());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step-000004", "step-000005"});  // nothing else left behind

  std::fill(values.begin(), values.end(), 55.0);
  train::checkpoint_record again;
  again.step = 5;
  train::save_checkpoint(d, again, tensors);
  std::fill(values.begin(), values.end(), 0.0);
  const auto loaded = train::load_checkpoint(dir.path(), {}, tensors);
  CHECK(loaded.record.step == 5);
  CHECK(loaded.record.data_position == 0);
  CHECK(values == std::vector<double>(8, 55.0));
  CHECK(error_of([&] { train::checkpoint_directory bad(dir.path(), -1); }).second.find("keep = -1") != std::string::npos);
}

namespace {

// The state the kill test's child saves: its values are a function of the step, so a load
// tells whether a checkpoint holds exactly one save's bytes.
std::vector<float> pattern(std::int64_t step, std::size_t tensor, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(step * 1000 + static_cast<std::int64_t>(tensor * 31 + i % 997));
  return v;
}

constexpr std::size_t kill_tensors = 6, kill_elements = std::size_t{1} << 18;  // 6 MiB per save

[[noreturn]] void save_forever(const fs::path& root, std::int64_t first_step) {
  std::vector<std::vector<float>> values(kill_tensors);
  std::vector<train::checkpoint_tensor> tensors;
  for (std::size_t t = 0; t < kill_tensors; ++t) {
    values[t].resize(kill_elements);
    tensors.push_back({"t" + std::to_string(t), t % 2 ? "model" : "optimizer", train::tensor_dtype::F32,
                       {static_cast<std::int64_t>(kill_elements)}, std::as_writable_bytes(std::span<float>(values[t]))});
  }
  const train::checkpoint_directory dir(root, /*keep=*/2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // never outlive a dead parent long
  for (std::int64_t step = first_step; std::chrono::steady_clock::now() < deadline; ++step) {
    for (std::size_t t = 0; t < kill_tensors; ++t) {
      const std::vector<float> v = pattern(step, t, kill_elements);
      std::copy(v.begin(), v.end(), values[t].begin());  // in place: the tensors point there
    }
    train::checkpoint_record r;
    r.step = step;
    train::save_checkpoint(dir, r, tensors);
  }
  std::_Exit(3);
}

}  // namespace

TEST_CASE("checkpoint: a save killed with SIGKILL at any moment leaves the last complete checkpoint loadable",
          "[checkpoint][kill]") {
  scratch_dir dir("kill");
  std::int64_t next = 1, last = 0;
  std::vector<std::string> observed;
  // Each round starts a saver and kills it at another moment of a save: from inside the file
  // writes to the manifest, the renames, `latest` and the deletion of old ones. Even rounds
  // kill at a fraction of a measured save period; odd ones the moment a save's .tmp directory
  // is seen, so that a save cut off in its writes is covered on every machine (a slow-compute
  // build such as ThreadSanitizer spends most of the child's period filling the tensors, and
  // the timed kills alone once missed every write).
  const int rounds = 8, timed_rounds = rounds / 2;
  for (int round = 0; round < rounds; ++round) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        save_forever(dir.path(), next);
      } catch (...) {
        std::_Exit(4);
      }
    }
    const auto latest_step = [&]() -> std::int64_t {
      try {
        return train::read_checkpoint(dir.path()).record.step;
      } catch (const train::checkpoint_error&) {
        return -1;  // none yet, or `latest` read while being replaced: ask again
      }
    };
    // One save's period, from `latest` naming one step to naming the next; then the kill lands
    // at fraction (round + 1/2) / rounds of the following one.
    const auto wait_for = [&](std::int64_t step) {
      const auto start = std::chrono::steady_clock::now();
      while (latest_step() < step && std::chrono::steady_clock::now() - start < std::chrono::seconds(30))
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      return std::chrono::steady_clock::now();
    };
    const auto first = wait_for(next);
    const auto period = wait_for(next + 1) - first;
    if (round % 2 == 0) {
      std::this_thread::sleep_for(period * (round / 2 + 0.5) / timed_rounds);
    } else {
      const auto save_in_flight = [&] {
        std::error_code ec;  // entries come and go while we list them
        for (fs::directory_iterator it(dir.path(), ec), end; !ec && it != end; it.increment(ec))
          if (it->path().extension() == ".tmp" && it->path().filename().string().starts_with("step-")) return true;
        return false;
      };
      const auto start = std::chrono::steady_clock::now();
      while (!save_in_flight() && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      }
    }
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFSIGNALED(status));

    // Load the latest: complete, verified, and every value that save's.
    std::vector<std::vector<float>> into(kill_tensors, std::vector<float>(kill_elements));
    std::vector<train::checkpoint_tensor> tensors;
    for (std::size_t t = 0; t < kill_tensors; ++t)
      tensors.push_back({"t" + std::to_string(t), "", train::tensor_dtype::F32, {static_cast<std::int64_t>(kill_elements)},
                         std::as_writable_bytes(std::span<float>(into[t]))});
    const auto [k, message] = error_of([&] {
      const auto loaded = train::load_checkpoint(dir.path(), {}, tensors);
      last = loaded.record.step;
    });
    INFO("round " << round << ": " << message);
    REQUIRE(message.empty());
    CHECK(last >= next + 1);
    bool same = true;
    for (std::size_t t = 0; t < kill_tensors; ++t) same = same && into[t] == pattern(last, t, kill_elements);
    CHECK(same);
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(dir.path())) left.push_back(e.path().filename().string());
    std::sort(left.begin(), left.end());
    std::string listing;
    for (const auto& l : left) listing += l + " ";
    observed.push_back(listing);
    next = last + 1;
  }
  // What the kills left behind differed (a .tmp of a save in flight, a latest.tmp, ...): the
  // kills did land at different moments of a save.
  INFO("directories after each kill:\n" << [&] {
    std::string s;
    for (const auto& o : observed) s += o + "\n";
    return s;
  }());
  CHECK(std::count_if(observed.begin(), observed.end(), [](const std::string& o) { return o.find(".tmp") != std::string::npos; }) >= 1);
}


// The fixture of the ctest entry checkpoint_interop_python (tests/train/CMakeLists.txt): a
// checkpoint written by a pp2 x cp2 mesh (float: two writing ranks, model and optimizer files)
// into $BATON_CHECKPOINT_INTEROP_DIR, and beside it expected.txt, every tensor's name, dtype,
// shape and values as the ranks held them, for read_safetensors.py to compare.
TEST_CASE("checkpoint interop: a mesh's checkpoint and the values its ranks held", "[.][checkpoint][interop]") {
  // Run without the variable (as in the whole executable's run, whose filter selects hidden
  // cases too), it writes into a scratch directory and checks its own side only.
  const char* env = std::getenv("BATON_CHECKPOINT_INTEROP_DIR");
  scratch_dir scratch("interop");
  const fs::path root = env != nullptr ? fs::path(env) : scratch.path();
  fs::remove_all(root);
  fs::create_directories(root);
  const mesh_case mesh = resume_meshes()[0];
  const train::lm_config config = small_config<float>();
  const auto lines = baton::run_local(4, [&](baton::local_communicator& world) {
    train::lm_trainer<float, baton::local_communicator, reference_attention> trainer(world, config, mesh.parallelism,
                                                                                    mesh.schedule);
    trainer.step(corpus().train_batch(0, config.batch, config.seq, false));
    train::save_checkpoint(trainer, train::checkpoint_directory(root));
    std::string text;  // what this rank holds, if it is the one that writes it
    std::vector<train::checkpoint_tensor> held;
    train::add_parameters(held, trainer.local_parameters());
    train::add_adamw_state(held, trainer.optimizer());
    for (const auto& t : held) {
      if (!trainer.writes_checkpoint()) break;
      text += t.name + " " + std::string(train::to_string(t.dtype)) + " ";
      for (std::size_t d = 0; d < t.shape.size(); ++d) text += (d ? "," : "") + std::to_string(t.shape[d]);
      const auto* values = reinterpret_cast<const float*>(t.bytes.data());
      for (std::size_t i = 0; i < t.bytes.size() / sizeof(float); ++i) {
        char v[32];
        std::snprintf(v, sizeof v, " %.17g", static_cast<double>(values[i]));
        text += v;
      }
      text += "\n";
    }
    return text;
  });
  std::ofstream out(root / "expected.txt");
  for (const auto& l : lines) out << l;
  CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) { return !l.empty(); }) == 2);
}

TEST_CASE("checkpoint docs: save on pp 2 x cp 2, resume on pp 4", "[checkpoint][docs]") {
  scratch_dir scratch("docs");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "tokens flow through stages around the ring. ";
  const train::byte_corpus corpus(text);
  train::lm_config config;
  config.model = {.d_model = 16, .heads = 4, .kv_heads = 2, .vocab = train::byte_corpus::vocab};
  config.layers = 4;
  config.seq = 16;
  config.batch = 4;

  // [doc:checkpoint_resume]
  const std::filesystem::path run = scratch.path() / "run";  // a directory of checkpoints
  const train::lm_parallelism zbv_ring{.mesh = {.pp = 2, .cp_ring = 2}, .cp = baton::nn::cp_mode::ring};
  const train::lm_parallelism pp4{.mesh = {.pp = 4}};

  // 4 steps on pp 2 x cp 2, a checkpoint every 2 steps, the last 2 kept.
  baton::run_local(4, [&](baton::local_communicator& world) {
    train::lm_trainer<double, baton::local_communicator, baton::reference_attention> trainer(
        world, config, zbv_ring, baton::zbv::generate(baton::shape_for<baton::zbv>(2, 4)));
    const train::checkpoint_directory dir(run, /*keep=*/2);
    for (std::int64_t step = 0; step < 4; ++step) {
      trainer.step(corpus.train_batch(step, config.batch, config.seq, false));
      if ((step + 1) % 2 == 0) train::save_checkpoint(trainer, dir);  // collective: run/step-000002, run/step-000004
    }
  });

  // Resumed on another mesh (pp 4, 1F1B) from the checkpoint `latest` names: step 4.
  const auto losses = baton::run_local(4, [&](baton::local_communicator& world) {
    train::lm_trainer<double, baton::local_communicator, baton::reference_attention> trainer(
        world, config, pp4, baton::one_f_one_b::generate(baton::shape_for<baton::one_f_one_b>(4, 4)));
    const train::lm_checkpoint_info resumed = train::load_checkpoint(trainer, run);  // collective
    std::vector<double> l;
    for (std::int64_t step = resumed.data_position; step < 6; ++step)
      l.push_back(trainer.step(corpus.train_batch(step, config.batch, config.seq, false)).loss);
    return l;
  });
  // [/doc:checkpoint_resume]

  // The same 6 steps on one rank, uninterrupted: 1e-10 (test_train.cpp's bound for meshes).
  train::lm_reference<double, baton::reference_attention> one_rank(config);
  std::vector<double> expected;
  for (std::int64_t step = 0; step < 6; ++step) {
    const double loss = one_rank.step(corpus.train_batch(step, config.batch, config.seq, false)).loss;
    if (step >= 4) expected.push_back(loss);
  }
  for (const auto& l : losses) {
    REQUIRE(l.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) CHECK(std::abs(l[i] - expected[i]) <= 1e-10 * expected[i]);
  }
  const train::checkpoint_directory dir(run);
  REQUIRE(dir.checkpoints().size() == 2);
  CHECK(dir.checkpoints()[1].first == 4);
}

TEST_CASE("checkpoint docs: any trainer's parameters, optimizer and random state", "[checkpoint][docs]") {
  scratch_dir scratch("docs_any");
  const fs::path run = scratch.path();
  baton::nn::linear<double> layer(3, 2, true, baton::nn::initializer(1));
  auto params = baton::nn::parameters_of<double>(layer);
  baton::nn::adamw<double> optimizer(params, {.lr = 0.1});
  for (auto& p : params) p.parameter->grad.fill(0.5);
  optimizer.step();
  std::mt19937_64 shuffle(42);
  (void)shuffle();
  const std::int64_t next_sample = 96;
  const auto saved_params = baton::detail::train::values_of<double>(layer);
  const std::uint64_t next_draw = std::mt19937_64(shuffle)();

  // [doc:checkpoint_any_trainer]
  std::vector<train::checkpoint_tensor> tensors;
  train::add_parameters(tensors, params);      // the file "model": every parameter by its name
  train::add_adamw_state(tensors, optimizer);  // "optimizer": <name>.exp_avg, <name>.exp_avg_sq
  train::checkpoint_record record;
  record.step = optimizer.steps();
  record.data_position = next_sample;
  record.random_states["shuffle"] = train::random_state_text(shuffle);
  record.model = {{"in", "3"}, {"out", "2"}};  // what a checkpoint must match to be loaded
  train::save_checkpoint(train::checkpoint_directory(run, /*keep=*/3), record, tensors);

  // Back, into the same tensors (on a mesh: the overloads that take the communicator).
  const train::loaded_checkpoint loaded = train::load_checkpoint(run, record.model, tensors);
  optimizer.set_steps(loaded.record.step);
  train::restore_random_state(loaded.record.random_states.at("shuffle"), shuffle);
  // [/doc:checkpoint_any_trainer]

  CHECK(loaded.record.data_position == 96);
  CHECK(shuffle() == next_draw);
  // Damage the state in memory, load again: it comes back exactly.
  for (auto& p : params) p.parameter->value.fill(0.0);
  optimizer.first_moment(0)[0] = 9;
  optimizer.set_steps(0);
  shuffle.discard(5);
  const auto again = train::load_checkpoint(run, record.model, tensors);
  optimizer.set_steps(again.record.step);
  CHECK(optimizer.steps() == 1);
  CHECK(optimizer.first_moment(0)[0] == (1 - 0.9) * 0.5);  // (1 - beta1) g after one step
  CHECK(first_bitwise_difference(baton::detail::train::values_of<double>(layer), saved_params).empty());
  const auto [k, message] = error_of([&] { train::load_checkpoint(run, {{"in", "4"}}, tensors); });
  CHECK(k == kind::other_model);
  CHECK(message.find("in is 3 in the checkpoint but 4 here") != std::string::npos);
}

TEST_CASE("checkpoint docs: the example of lm_checkpoint.hpp's comment", "[checkpoint][docs]") {
  scratch_dir scratch("docs_comment");
  const fs::path path = scratch.path();
  const mesh_case mesh = resume_meshes()[0];  // ZBV pp2 x cp2
  const std::int64_t steps = 4, every = 2, more = 1;
  const train::byte_corpus& corpus = checkpoint_test::corpus();
  const train::lm_config rows = small_config<double>();
  const auto results = baton::run_local(4, [&](baton::local_communicator& world) {
    train::lm_trainer<double, baton::local_communicator, reference_attention> trainer(world, rows, mesh.parallelism,
                                                                                     mesh.schedule);
    train::lm_trainer<double, baton::local_communicator, reference_attention> other_trainer(world, rows, mesh.parallelism,
                                                                                           mesh.schedule);
    const auto& c = rows;
    {
      const auto& config = c;  // the comment's names
      // [doc:lm_checkpoint_comment]
      baton::train::checkpoint_directory dir(path, /*keep=*/3);
      for (std::int64_t step = 0; step < steps; ++step) {
        trainer.step(corpus.train_batch(step, config.batch, config.seq, false));
        if ((step + 1) % every == 0) baton::train::save_checkpoint(trainer, dir);  // collective
      }
      // Later, in a new process, on the same mesh or another: the checkpoint `latest` names.
      const auto resumed = baton::train::load_checkpoint(other_trainer, path);
      for (std::int64_t step = resumed.data_position; step < steps + more; ++step)
        other_trainer.step(corpus.train_batch(step, config.batch, config.seq, false));
      // [/doc:lm_checkpoint_comment]
    }
    trainer.step(corpus.train_batch(steps, c.batch, c.seq, false));
    return std::pair{trainer.parameters(), other_trainer.parameters()};
  });
  for (const auto& [straight, resumed] : results) CHECK(first_bitwise_difference(straight, resumed).empty());
}

#endif  // BATON_HAS_JSON()
