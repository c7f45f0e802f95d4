// Linked into test_attention_avx2, whose sources are compiled for AVX2 and FMA: on a CPU
// without them the test reports SKIPPED (ctest's skip pattern) instead of dying on an
// illegal instruction. The check is baseline x86-64 code whatever the target's flags and
// runs before the C++ static initializers of the other sources (constructor priority 101).
#include <cstdio>
#include <cstdlib>

namespace {

__attribute__((target("arch=x86-64"), constructor(101))) void require_avx2_and_fma() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return;
  std::puts("SKIPPED: this CPU has no AVX2 and FMA, which test_attention_avx2 was built for");
  std::fflush(stdout);
  std::_Exit(0);
}

}  // namespace
