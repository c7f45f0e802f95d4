// No CUDA in host-only headers: every header under include/baton/ that is not a backend
// header (a .cuh, or a path component or stem named cuda or nccl) must compile with plain
// g++ and no CUDA toolkit, so a CUDA symbol in one is a bug even when the header check's g++
// build happens to have CUDA headers around. Runs everywhere, GPU or not (label cuda).
#include "catch.hpp"
#include "host_header_scan.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> symbols_in(const std::string& source) {
  std::vector<std::string> out;
  for (const auto& f : header_scan::scan(source)) out.push_back(std::to_string(f.line) + ":" + f.symbol);
  return out;
}

}  // namespace

TEST_CASE("the scanner finds CUDA symbols in code", "[headers][cuda]") {
  CHECK(symbols_in("__global__ void k();") == std::vector<std::string>{"1:__global__"});
  CHECK(symbols_in("int a;\n__device__ int b;") == std::vector<std::string>{"2:__device__"});
  CHECK(symbols_in("#include <cuda_runtime.h>") == std::vector<std::string>{"1:#include <cuda_runtime.h>"});
  CHECK(symbols_in("#  include <nccl.h>") == std::vector<std::string>{"1:#  include <nccl.h>"});
  CHECK(symbols_in("void f(cudaStream_t s);") == std::vector<std::string>{"1:cudaStream_t"});
  CHECK(symbols_in("ncclComm_t c;") == std::vector<std::string>{"1:ncclComm_t"});
  CHECK(symbols_in("__nv_bfloat16 x;") == std::vector<std::string>{"1:__nv_bfloat16"});
  CHECK(symbols_in("k<<<1, 2>>>();") == std::vector<std::string>{"1:<<<"});
  CHECK(symbols_in("int i = threadIdx.x;") == std::vector<std::string>{"1:threadIdx"});
  CHECK(symbols_in("__host__ __device__ f();").size() == 2);
}

TEST_CASE("the scanner ignores comments, literals, baton includes and baton's own names", "[headers][cuda]") {
  CHECK(symbols_in("// __global__ cudaStream_t\nint x;").empty());
  CHECK(symbols_in("/* __device__\n ncclSend */ int y;").empty());
  CHECK(symbols_in("const char* s = \"link baton::nccl, cudaMalloc \\\" __global__\";").empty());
  CHECK(symbols_in("auto r = R\"x(cudaFree __device__)x\";").empty());
  CHECK(symbols_in("char c = '\"'; int z = 1'000;").empty());
  CHECK(symbols_in("#if BATON_HAS_NCCL()\n#include <baton/comm/nccl.hpp>\n#endif").empty());
  CHECK(symbols_in("struct cuda_device_memory; class nccl_communicator; int cudaish;").empty());
  // Line numbers survive the blanked comment lines.
  CHECK(symbols_in("/*\n\n*/\n\n__global__ void k();") == std::vector<std::string>{"5:__global__"});
}

TEST_CASE("backend headers are told apart like the header check groups them", "[headers][cuda]") {
  CHECK(header_scan::may_hold_cuda("baton/payload/cuda.hpp"));
  CHECK(header_scan::may_hold_cuda("baton/comm/nccl.hpp"));
  CHECK(header_scan::may_hold_cuda("baton/attention/cuda/plan.hpp"));
  CHECK(header_scan::may_hold_cuda("baton/attention/cuda_kernels.hpp"));
  CHECK(header_scan::may_hold_cuda("baton/attention/detail/flash.cuh"));
  CHECK_FALSE(header_scan::may_hold_cuda("baton/cp/memory.hpp"));
  CHECK_FALSE(header_scan::may_hold_cuda("baton/payload/traits.hpp"));
  CHECK_FALSE(header_scan::may_hold_cuda("baton/attention/cudaish.hpp"));
}

TEST_CASE("no host-only header under include/baton holds a CUDA symbol", "[headers][cuda]") {
  namespace fs = std::filesystem;
  const fs::path root = BATON_INCLUDE_DIR;
  REQUIRE(fs::is_directory(root / "baton"));
  std::size_t scanned = 0;
  std::string problems;
  for (const auto& entry : fs::recursive_directory_iterator(root / "baton")) {
    if (!entry.is_regular_file()) continue;
    const auto ext = entry.path().extension().string();
    if (ext != ".hpp" && ext != ".h" && ext != ".cuh") continue;
    const std::string relative = fs::relative(entry.path(), root).generic_string();
    if (header_scan::may_hold_cuda(relative)) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    ++scanned;
    for (const auto& f : header_scan::scan(text.str())) {
      problems += "include/" + relative + ":" + std::to_string(f.line) + ": CUDA symbol `" + f.symbol + "` in a host-only "
                  "header (move it to a header under a cuda/ or nccl/ path, or a .cuh): " + f.text + "\n";
    }
  }
  INFO(problems);
  CHECK(problems.empty());
  CHECK(scanned > 50);  // the walk found the headers (a wrong root would scan nothing and pass)
}
