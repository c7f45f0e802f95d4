// bench_cuda_static — what can be measured of the CUDA attention kernels without a GPU: the
// compiled kernels' resources and instruction mix for sm_90, and the host-side planning time
// of a call. A CPU program; built by the bench preset wherever nvcc is (bench/gpu/CMakeLists.txt
// compiles bench/gpu/static_kernels.cu with bench/gpu/compile_static.sh first).
//
//   ./bench_cuda_static [--pairs N] [PTXAS_LOG [SASS_MIX]]
//
// Per kernel (forward per tiling, backward key and query passes, pre-pass, key flags; every
// storage type and head dim), from ptxas -v:
//   <kernel>_registers, _spill_bytes (stores + loads), _stack_bytes, _shared_bytes (the
//   launch's dynamic shared memory, from the same tiling code the launch uses, + static),
//   _blocks_per_sm (resident blocks on an sm_90 SM: registers in 256-per-warp units of a 64K
//   file, 228 KiB of shared memory less 1 KiB per block, 2048 threads, 32 blocks).
// From the SASS (bench/gpu/sass_mix.py, run by compile_static.sh where an nvdisasm is: the CUDA
// install of the machines this project is built on has none, bench/gpu/fetch_nvdisasm.sh
// fetches Debian's), per kernel with a tensor-core loop:
//   <kernel>_mma_share: MMA instructions / all instructions on the shortest way through the
//   main loop (the path of a full tile with no special case; NOPs not counted);
//   <kernel>_mma_share_static: the same over the loop's whole body, every branch included;
//   <kernel>_loop_instructions: the shortest way's length, and _loop_mma its MMAs.
// Without a disassembler these print nothing and `mma_share: unavailable (why)` says so.
// Summary figures: max_spill_bytes (over every kernel; goal 0), forward_min_blocks_per_sm
// (16-bit forward kernels; goal >= 2), and the planning time of one call on this CPU,
// median (min, max) of --pairs repetitions, S = 8192 at the forward's bf16 D = 128 tiling:
// plan_ms_causal_S8192 (goal <= 0.2), plan_ms_full_S8192, plan_ms_documents_S8192 (8
// documents); with the SASS, forward16_min_mma_share and backward16_min_mma_share (the
// lowest main-loop share of the 16-bit forward / backward tile kernels) and
// sass_undecoded_instructions (instructions the disassembler left out, counted as unknown:
// 0 means the counts are complete).
#include "bench_common.hpp"

#include <baton/attention/cuda/detail/backward_kernel.hpp>
#include <baton/attention/cuda/plan.hpp>
#include <baton/attention/masks.hpp>

#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#ifndef BATON_STATIC_PTXAS_LOG
#define BATON_STATIC_PTXAS_LOG ""
#endif
#ifndef BATON_STATIC_SASS_MIX
#define BATON_STATIC_SASS_MIX ""
#endif

namespace {

namespace dc = baton::detail::attention::cuda;

struct kernel_stats {
  std::string mangled, demangled, figure;  // figure: the short name the figures use
  int registers = 0, stack = 0, spill_stores = 0, spill_loads = 0, static_shared = 0;
  int threads = 0;
  std::size_t dynamic_shared = 0;
  bool forward16 = false, backward16 = false;  // a 16-bit forward / backward tile kernel
  // Main loop (sass_mix.py): instructions and MMAs over its whole body and on its shortest way.
  int static_instructions = 0, static_mma = 0, path_instructions = 0, path_mma = 0;
  int undecoded = 0;  // instructions of the kernel the disassembler left out (counted as unknown)
};

std::string demangle(const std::string& name) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> text(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status),
                                                   &std::free);
  return status == 0 && text ? std::string(text.get()) : name;
}

// "float" / "bf16" / "fp16" from a demangled storage type; its size in bytes.
std::pair<std::string, int> storage_of(const std::string& demangled) {
  if (demangled.find("bfloat16_codec") != std::string::npos) return {"bf16", 2};
  if (demangled.find("float16_codec") != std::string::npos) return {"fp16", 2};
  return {"float", 4};
}

template <class S, int D, bool KeyPass>
void backward_layout(kernel_stats& k) {
  using L = dc::backward_pass_layout<S, D, KeyPass>;
  k.threads = L::threads;
  k.dynamic_shared = L::bytes;
}

template <class S>
void backward_layout_for(kernel_stats& k, int dim, bool key_pass) {
  if (dim == 64) key_pass ? backward_layout<S, 64, true>(k) : backward_layout<S, 64, false>(k);
  if (dim == 128) key_pass ? backward_layout<S, 128, true>(k) : backward_layout<S, 128, false>(k);
  if (dim == 256) key_pass ? backward_layout<S, 256, true>(k) : backward_layout<S, 256, false>(k);
}

// The launch shape of a kernel, from its template arguments and the launch code's own tiling
// functions; false for a kernel this program does not know (a new one: add it here).
bool describe(kernel_stats& k) {
  const std::string& d = k.demangled;
  const auto [storage, bytes] = storage_of(d);
  std::smatch m;
  if (std::regex_search(d, m, std::regex(R"(forward_kernel<.*, (\d+), (\d+), (\d+)>\()"))) {
    const int dim = std::stoi(m[1]), m_tiles = std::stoi(m[2]), tile_k = std::stoi(m[3]);
    const dc::forward_config c = dc::make_forward_config(bytes, dim, m_tiles, tile_k);
    k.threads = c.threads;
    k.dynamic_shared = c.shared_bytes();
    k.forward16 = bytes == 2;
    k.figure = "fwd_" + storage + "_D" + std::to_string(dim) + "_" + std::to_string(c.tile_q) + "x" + std::to_string(tile_k);
    return true;
  }
  if (std::regex_search(d, m, std::regex(R"(backward_tile_kernel<.*, (\d+), (true|false)>\()"))) {
    const int dim = std::stoi(m[1]);
    const bool key_pass = m[2] == "true";
    if (storage == "float") backward_layout_for<float>(k, dim, key_pass);
    if (storage == "bf16") backward_layout_for<baton::bfloat16>(k, dim, key_pass);
    if (storage == "fp16") backward_layout_for<baton::float16>(k, dim, key_pass);
    k.backward16 = storage != "float";
    k.figure = std::string(key_pass ? "bwd_key_" : "bwd_query_") + storage + "_D" + std::to_string(dim);
    return k.threads > 0;
  }
  if (d.find("backward_prepass_kernel<") != std::string::npos) {
    k.threads = dc::prepass_threads;
    k.figure = "bwd_prepass_" + storage;
    return true;
  }
  if (d.find("key_flag_kernel<") != std::string::npos) {
    k.threads = dc::key_flag_threads;
    k.figure = "key_flags_" + storage;
    return true;
  }
  return false;
}

// Resident blocks of a kernel on one sm_90 SM.
int blocks_per_sm_sm90(const kernel_stats& k) {
  constexpr int register_file = 65536, threads_per_sm = 2048, max_blocks = 32;
  constexpr std::size_t shared_per_sm = 228 * 1024, reserved_per_block = 1024;
  const int warps = (k.threads + 31) / 32;
  const int per_warp = (k.registers * 32 + 255) / 256 * 256;
  const int by_registers = per_warp > 0 ? register_file / (per_warp * warps) : max_blocks;
  const std::size_t shared = k.dynamic_shared + static_cast<std::size_t>(k.static_shared);
  const int by_shared = static_cast<int>(shared_per_sm / (shared + reserved_per_block));
  return std::min({by_registers, by_shared, threads_per_sm / std::max(1, k.threads), max_blocks});
}

std::vector<kernel_stats> read_ptxas(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the ptxas log " + path);
  std::vector<kernel_stats> kernels;
  const std::regex entry(R"(Compiling entry function '([^']+)')"),
      frame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)"),
      used(R"(Used (\d+) registers)"), smem(R"((\d+) bytes smem)");
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, entry)) {
      kernels.push_back({});
      kernels.back().mangled = m[1];
      kernels.back().demangled = demangle(m[1]);
    } else if (kernels.empty()) {
      continue;
    } else if (std::regex_search(line, m, frame)) {
      kernels.back().stack = std::stoi(m[1]);
      kernels.back().spill_stores = std::stoi(m[2]);
      kernels.back().spill_loads = std::stoi(m[3]);
    } else if (std::regex_search(line, m, used)) {
      kernels.back().registers = std::stoi(m[1]);
      if (std::regex_search(line, m, smem)) kernels.back().static_shared = std::stoi(m[1]);
    }
  }
  return kernels;
}

// Adds sass_mix.py's figures to the kernels they name; the reason when there are none.
std::string read_sass_mix(const std::string& path, std::vector<kernel_stats>& kernels) {
  std::ifstream in(path);
  if (!in) return "no file " + path;
  std::string line;
  int matched = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# unavailable: ", 0) == 0) return line.substr(15);
    std::istringstream fields(line);
    std::string name;
    int si = 0, sm = 0, pi = 0, pm = 0, undecoded = 0;
    if (!(fields >> name >> si >> sm >> pi >> pm >> undecoded) || pi <= 0 || si <= 0)
      return "unreadable line in " + path + ": " + line;
    for (kernel_stats& k : kernels)
      if (k.mangled == name) {
        k.static_instructions = si, k.static_mma = sm, k.path_instructions = pi, k.path_mma = pm;
        k.undecoded = undecoded;
        ++matched;
      }
  }
  return matched > 0 ? "" : "no kernel of the ptxas log in " + path;
}

double plan_ms(const auto& mask, std::int64_t seq) {
  const baton::positions all(0, seq);
  const dc::forward_config c = dc::forward_config_for(2, 128);
  const auto t0 = std::chrono::steady_clock::now();
  const dc::tile_plan plan = dc::make_tile_plan(mask, all, all, seq, seq, c.tile_q, c.tile_k);
  const auto t1 = std::chrono::steady_clock::now();
  if (plan.nonempty_tiles() == 0) std::printf("plan: no tile\n");
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string ptxas_log = BATON_STATIC_PTXAS_LOG, sass_mix = BATON_STATIC_SASS_MIX;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--pairs") == 0) ++i;
    else files.emplace_back(argv[i]);
  if (files.size() >= 1) ptxas_log = files[0];
  if (files.size() >= 2) sass_mix = files[1];
  const int repetitions = bench::pairs_from_args(argc, argv, 21);
  bench::print_build();
  bench::print_load("before");
  int status = 0;
  try {
    std::vector<kernel_stats> kernels = read_ptxas(ptxas_log);
    if (kernels.empty()) throw std::runtime_error("no kernel in the ptxas log " + ptxas_log);
    std::printf("kernels: %zu, sm_90 (ptxas log %s)\n", kernels.size(), ptxas_log.c_str());
    const std::string no_mix = read_sass_mix(sass_mix, kernels);
    int max_spill = 0, forward_min_blocks = 1 << 20;
    double forward_min_share = 1, backward_min_share = 1;
    for (kernel_stats& k : kernels) {
      if (!describe(k)) {
        std::printf("FAILED: unknown kernel %s (teach bench_cuda_static its launch shape)\n", k.demangled.c_str());
        status = 1;
        continue;
      }
      const int spill = k.spill_stores + k.spill_loads, blocks = blocks_per_sm_sm90(k);
      max_spill = std::max(max_spill, spill);
      if (k.forward16) forward_min_blocks = std::min(forward_min_blocks, blocks);
      std::printf("%s_registers: %d\n", k.figure.c_str(), k.registers);
      std::printf("%s_spill_bytes: %d\n", k.figure.c_str(), spill);
      std::printf("%s_stack_bytes: %d\n", k.figure.c_str(), k.stack);
      std::printf("%s_shared_bytes: %zu\n", k.figure.c_str(), k.dynamic_shared + static_cast<std::size_t>(k.static_shared));
      std::printf("%s_blocks_per_sm: %d\n", k.figure.c_str(), blocks);
      if (k.path_instructions > 0) {
        const double share = static_cast<double>(k.path_mma) / k.path_instructions;
        std::printf("%s_mma_share: %.3f\n", k.figure.c_str(), share);
        std::printf("%s_mma_share_static: %.3f\n", k.figure.c_str(), static_cast<double>(k.static_mma) / k.static_instructions);
        std::printf("%s_loop_instructions: %d\n", k.figure.c_str(), k.path_instructions);
        std::printf("%s_loop_mma: %d\n", k.figure.c_str(), k.path_mma);
        if (k.forward16) forward_min_share = std::min(forward_min_share, share);
        if (k.backward16) backward_min_share = std::min(backward_min_share, share);
      }
    }
    std::printf("max_spill_bytes: %d\n", max_spill);
    std::printf("forward_min_blocks_per_sm: %d\n", forward_min_blocks);
    if (no_mix.empty()) {
      std::printf("forward16_min_mma_share: %.3f\n", forward_min_share);
      std::printf("backward16_min_mma_share: %.3f\n", backward_min_share);
      // 0 with CUDA 12.4's nvdisasm; CUDA 11.8's leaves out instructions it cannot decode.
      int undecoded = 0;
      for (const kernel_stats& k : kernels) undecoded += k.undecoded;
      std::printf("sass_undecoded_instructions: %d\n", undecoded);
    } else {
      std::printf("mma_share: unavailable (%s)\n", no_mix.c_str());
    }
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    status = 1;
  }

  // Planning, interleaved: causal, full, documents, in an order that rotates.
  constexpr std::int64_t seq = 8192;
  std::vector<std::int64_t> documents(static_cast<std::size_t>(seq));
  for (std::int64_t p = 0; p < seq; ++p) documents[static_cast<std::size_t>(p)] = p * 8 / seq;
  const baton::document_mask docs(documents);
  bench::series causal, full, packed;
  (void)plan_ms(baton::causal_mask{}, seq), (void)plan_ms(baton::no_mask{}, seq), (void)plan_ms(docs, seq);  // warm-up
  for (int r = 0; r < repetitions; ++r)
    for (int s = 0; s < 3; ++s) switch ((s + r) % 3) {
        case 0: causal.add(plan_ms(baton::causal_mask{}, seq)); break;
        case 1: full.add(plan_ms(baton::no_mask{}, seq)); break;
        default: packed.add(plan_ms(docs, seq)); break;
      }
  bench::print("plan_ms_causal_S8192", causal, "%.4f");
  bench::print("plan_ms_full_S8192", full, "%.4f");
  bench::print("plan_ms_documents_S8192", packed, "%.4f");
  bench::print_load("after");
  return status;
}
