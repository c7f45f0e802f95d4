// baton/attention/cuda/detail/simt.hpp — one kernel source for the GPU and for CPU tests.
//
// A kernel body is written once, over a *block* of threads, against a context type Ctx:
//   - on the device (simt.cuh: device_block<Threads>), each thread runs the body with its
//     own registers; a per-thread value is lanes<T, 1>, which is one T (zero overhead);
//   - on the host (here: host_block<Threads>), the whole block runs the body in LOCKSTEP:
//     a per-thread value is lanes<T, Threads>, an array with one T per thread, and every
//     operation applies to all of them. __syncthreads() is then trivially satisfied,
//     shared memory is a plain array, and a warp shuffle is a permutation inside each group
//     of 32 lanes.
//
// Rules for a body (so that both readings mean the same thing):
//   - control flow is block-uniform (loops and branches on values that are the same for
//     every thread: block indices, tile counts, plan entries); per-thread decisions are
//     select(cond, a, b) on lanes;
//   - every shared-memory access goes through the context (shared_load / shared_store /
//     copy16_async / ldmatrix_*), so the host can check for races (below);
//   - global memory is read and written through the context too (load / store with a
//     per-lane "active" predicate);
//   - loops with a compile-time trip count carry BATON_UNROLL (registers, not local memory).
//
// The context's interface (host_block here, device_block in simt.cuh, same names):
//   threads, width, lanes_of<T>; block_x/y/z(); thread_index(), lane(), warp();
//   sync_block(), sync_or(pred) (__syncthreads_or), warp_any(pred) (__any_sync); shared_load<T>(byte offset),
//   shared_store<T>(byte offset, value, active); copy16_async(dst offset, src, valid),
//   commit_async(), wait_async<N>(); ldmatrix_x4(out[4], row offset, trans);
//   shfl_xor(x, mask), shfl(x, source lane); load(ptrs, active), store(ptrs, values, active).
// Free functions on lanes: arithmetic and comparison operators, select, cast<U>, max, min,
// map(f, ...), exp2; tensor-core ops in mma.hpp (host) / mma.cuh (device).
//
// Host race detector: shared memory is tracked per 4-byte word. Between two sync_block()
// calls, a word written by one thread and read or written by another is a race (on the
// device it would need a __syncthreads between them): the host throws simt_race naming the
// word and both threads. A missing __syncthreads then fails a CPU test instead of giving a
// wrong answer once in a while on a GPU. (Accesses by the same warp between sync_warp()
// calls are treated the same way as any two threads: the kernels here do not rely on
// warp-synchronous shared memory.)
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <math.h>  // ::exp2f, ::log2f: one name for the host's and the device's
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <baton/attention/cuda/storage.hpp>
#include <baton/core/cuda_annotations.hpp>

/// Before a loop with a compile-time trip count in a kernel body: fully unrolled on the
/// device, so per-thread arrays indexed by the loop stay in registers (a loop left rolled
/// moves them to local memory). Nothing on the host.
#if BATON_CUDA_COMPILATION()
#define BATON_UNROLL _Pragma("unroll")
#else
#define BATON_UNROLL
#endif

namespace baton::detail::attention::cuda::simt {

inline constexpr int warp_size = 32;

/// One value per thread of a block: N = 1 on the device (one T), N = threads on the host.
template <class T, int N>
struct lanes {
  static_assert(N >= 1, "baton simt: lanes needs at least one thread");
  T v[N];

  lanes() = default;
  /// Broadcast: every thread gets x.
  BATON_HD lanes(T x) noexcept {  // NOLINT(google-explicit-constructor): broadcasting is the point
    for (int i = 0; i < N; ++i) v[i] = x;
  }
  BATON_HD T& operator[](int i) noexcept { return v[i]; }
  BATON_HD const T& operator[](int i) const noexcept { return v[i]; }
  static constexpr int size() noexcept { return N; }
};

/// f applied thread by thread: map(f, a, b) has f(a[i], b[i]) in lane i.
template <class F, class A, int N, class... R>
[[nodiscard]] BATON_HD inline auto map(F f, const lanes<A, N>& a, const R&... rest) noexcept {
  using U = decltype(f(a.v[0], rest.v[0]...));
  lanes<U, N> out;
  for (int i = 0; i < N; ++i) out.v[i] = f(a.v[i], rest.v[i]...);
  return out;
}

#define BATON_SIMT_BINARY(op)                                                                        \
  template <class T, class U, int N>                                                                 \
  [[nodiscard]] BATON_HD inline auto operator op(const lanes<T, N>& a, const lanes<U, N>& b) noexcept { \
    lanes<decltype(a.v[0] op b.v[0]), N> r;                                                          \
    for (int i = 0; i < N; ++i) r.v[i] = a.v[i] op b.v[i];                                           \
    return r;                                                                                        \
  }                                                                                                  \
  template <class T, class U, int N>                                                                 \
    requires std::is_arithmetic_v<U>                                                                 \
  [[nodiscard]] BATON_HD inline auto operator op(const lanes<T, N>& a, U b) noexcept {                 \
    lanes<decltype(a.v[0] op b), N> r;                                                               \
    for (int i = 0; i < N; ++i) r.v[i] = a.v[i] op b;                                                \
    return r;                                                                                        \
  }                                                                                                  \
  template <class T, class U, int N>                                                                 \
    requires std::is_arithmetic_v<U>                                                                 \
  [[nodiscard]] BATON_HD inline auto operator op(U a, const lanes<T, N>& b) noexcept {                 \
    lanes<decltype(a op b.v[0]), N> r;                                                               \
    for (int i = 0; i < N; ++i) r.v[i] = a op b.v[i];                                                \
    return r;                                                                                        \
  }
BATON_SIMT_BINARY(+)
BATON_SIMT_BINARY(-)
BATON_SIMT_BINARY(*)
BATON_SIMT_BINARY(/)
BATON_SIMT_BINARY(%)
BATON_SIMT_BINARY(&)
BATON_SIMT_BINARY(|)
BATON_SIMT_BINARY(^)
BATON_SIMT_BINARY(<<)
BATON_SIMT_BINARY(>>)
BATON_SIMT_BINARY(<)
BATON_SIMT_BINARY(<=)
BATON_SIMT_BINARY(>)
BATON_SIMT_BINARY(>=)
BATON_SIMT_BINARY(==)
BATON_SIMT_BINARY(!=)
BATON_SIMT_BINARY(&&)
BATON_SIMT_BINARY(||)
#undef BATON_SIMT_BINARY

/// x, as a value the compiler must recompute where it is used: a kernel calls it once per
/// iteration of its main loop on the lane index, so that the (swizzled) shared-memory
/// addresses derived from it are computed next to their loads instead of hoisted out of the
/// loop, where they would hold registers for the whole loop. The identity on the host.
template <class T, int N>
[[nodiscard]] BATON_HD inline lanes<T, N> opaque(const lanes<T, N>& x) noexcept {
#if defined(__CUDA_ARCH__)
  static_assert(N == 1 && sizeof(T) == 4, "baton simt: opaque takes a 32-bit device value");
  lanes<T, N> r;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(r.v[0]) : "r"(x.v[0]));
  return r;
#else
  return x;
#endif
}

template <class T, int N>
[[nodiscard]] BATON_HD inline lanes<T, N> operator-(const lanes<T, N>& a) noexcept {
  lanes<T, N> r;
  for (int i = 0; i < N; ++i) r.v[i] = -a.v[i];
  return r;
}
template <class T, int N>
[[nodiscard]] BATON_HD inline lanes<bool, N> operator!(const lanes<T, N>& a) noexcept {
  lanes<bool, N> r;
  for (int i = 0; i < N; ++i) r.v[i] = !a.v[i];
  return r;
}

/// Divergent code as data flow: cond ? a : b per thread (never evaluates a NaN into a
/// masked result: the unselected value is dropped, not multiplied by 0).
template <class T, int N>
[[nodiscard]] BATON_HD inline lanes<T, N> select(const lanes<bool, N>& cond, const lanes<T, N>& a,
                                                 const lanes<T, N>& b) noexcept {
  lanes<T, N> r;
  for (int i = 0; i < N; ++i) r.v[i] = cond.v[i] ? a.v[i] : b.v[i];
  return r;
}

/// Element conversion (static_cast per thread).
template <class U, class T, int N>
[[nodiscard]] BATON_HD inline lanes<U, N> cast(const lanes<T, N>& a) noexcept {
  lanes<U, N> r;
  for (int i = 0; i < N; ++i) r.v[i] = static_cast<U>(a.v[i]);
  return r;
}

/// The larger of a and b per thread. For float it is fmaxf (one FMNMX on the device, where
/// a compare and a select took two): a NaN operand yields the other operand, and it is the
/// same function on the host, so the emulation agrees.
template <class T, int N>
[[nodiscard]] BATON_HD inline lanes<T, N> max(const lanes<T, N>& a, const lanes<T, N>& b) noexcept {
  lanes<T, N> r;
  for (int i = 0; i < N; ++i) {
    if constexpr (std::is_same_v<T, float>)
      r.v[i] = ::fmaxf(a.v[i], b.v[i]);
    else
      r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
  }
  return r;
}
template <class T, int N>
[[nodiscard]] BATON_HD inline lanes<T, N> min(const lanes<T, N>& a, const lanes<T, N>& b) noexcept {
  lanes<T, N> r;
  for (int i = 0; i < N; ++i) r.v[i] = a.v[i] < b.v[i] ? a.v[i] : b.v[i];
  return r;
}

/// a * b + c rounded once (fmaf; one FFMA on the device), per thread.
template <int N>
[[nodiscard]] BATON_HD inline lanes<float, N> fma(const lanes<float, N>& a, const lanes<float, N>& b,
                                                 const lanes<float, N>& c) noexcept {
  lanes<float, N> r;
  for (int i = 0; i < N; ++i) r.v[i] = ::fmaf(a.v[i], b.v[i], c.v[i]);
  return r;
}

/// 2^x and log2(x) in float. exp2_fast flushes results below 2^-126 (FLT_MIN) to 0: on the
/// device it is ex2.approx.ftz (~2 ulp, one MUFU.EX2; CUDA's exp2f keeps subnormal results
/// at three more instructions per value, which a softmax never needs: such a P is below
/// 2^-126 of the row's largest), on the host the C library's exp2f flushed the same way.
/// log2_fast is CUDA's log2f on the device and the C library's on the host.
[[nodiscard]] BATON_HD inline float exp2_fast(float x) noexcept {
#if defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#else
  const float r = ::exp2f(x);
  return r < std::numeric_limits<float>::min() ? 0.0f : r;  // NaN compares false and stays NaN
#endif
}
[[nodiscard]] BATON_HD inline float log2_fast(float x) noexcept { return ::log2f(x); }
template <int N>
[[nodiscard]] BATON_HD inline lanes<float, N> exp2(const lanes<float, N>& a) noexcept {
  lanes<float, N> r;
  for (int i = 0; i < N; ++i) r.v[i] = exp2_fast(a.v[i]);
  return r;
}

/// Whether any thread's value is true (host-side checks; a body keeps its control flow
/// block-uniform, so it branches on values it knows are uniform, not on this).
template <int N>
[[nodiscard]] inline bool any_of(const lanes<bool, N>& a) noexcept {
  for (int i = 0; i < N; ++i)
    if (a.v[i]) return true;
  return false;
}

/// Thrown by the host emulation when two threads touch one shared word without a
/// sync_block() between them (one of the accesses a write).
class simt_race : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// The host reading of a block of Threads threads (see the file comment).
template <int Threads>
class host_block {
 public:
  static_assert(Threads % warp_size == 0, "baton simt: a block is whole warps");
  static constexpr int threads = Threads;
  static constexpr int width = Threads;  // lanes per value
  static constexpr bool is_device = false;
  template <class T>
  using lanes_of = lanes<T, Threads>;

  /// A block with shared_bytes bytes of (dynamic) shared memory, zero-filled is NOT promised
  /// on the device, so the host fills it with 0xff bytes (a NaN pattern) to expose reads of
  /// words never written.
  explicit host_block(std::size_t shared_bytes, bool detect_races = true)
      : shared_((shared_bytes + 15) / 16 * 16, std::byte{0xff}), check_(detect_races) {
    if (check_) words_.assign(shared_.size() / 4, word_state{});
  }

  /// Block index (uniform), set by the launcher before each block runs.
  std::array<int, 3> block_index{0, 0, 0};
  [[nodiscard]] int block_x() const noexcept { return block_index[0]; }
  [[nodiscard]] int block_y() const noexcept { return block_index[1]; }
  [[nodiscard]] int block_z() const noexcept { return block_index[2]; }

  [[nodiscard]] static lanes_of<int> thread_index() noexcept {
    lanes_of<int> r;
    for (int i = 0; i < Threads; ++i) r.v[i] = i;
    return r;
  }
  [[nodiscard]] static lanes_of<int> lane() noexcept { return thread_index() % warp_size; }
  [[nodiscard]] static lanes_of<int> warp() noexcept { return thread_index() / warp_size; }

  /// __syncthreads(): every access before it happens before every access after it.
  void sync_block() noexcept { ++epoch_; }
  /// __syncthreads_or(pred): a barrier that also tells every thread whether any pred held.
  [[nodiscard]] bool sync_or(const lanes_of<bool>& pred) noexcept {
    ++epoch_;
    return any_of(pred);
  }
  /// __any_sync over the calling warp. The host runs every warp at once, so it answers for
  /// the whole block: true whenever any warp's answer is. A body may therefore branch on it
  /// only to skip work that is an identity on the threads whose pred is false.
  [[nodiscard]] static bool warp_any(const lanes_of<bool>& pred) noexcept { return any_of(pred); }

  /// Start of dynamic shared memory (byte offsets below are from here).
  [[nodiscard]] std::byte* shared_base() noexcept { return shared_.data(); }
  [[nodiscard]] std::size_t shared_bytes() const noexcept { return shared_.size(); }

  /// Per-thread load of a T at byte offset `offset` of shared memory.
  template <class T>
  [[nodiscard]] lanes_of<T> shared_load(const lanes_of<std::uint32_t>& offset) {
    lanes_of<T> r;
    for (int t = 0; t < Threads; ++t) {
      touch(offset.v[t], sizeof(T), t, false);
      std::memcpy(&r.v[t], shared_.data() + offset.v[t], sizeof(T));
    }
    return r;
  }
  /// Per-thread store of value at byte offset `offset`, by the threads where active.
  template <class T>
  void shared_store(const lanes_of<std::uint32_t>& offset, const lanes_of<T>& value,
                    const lanes_of<bool>& active = lanes_of<bool>(true)) {
    for (int t = 0; t < Threads; ++t) {
      if (!active.v[t]) continue;
      touch(offset.v[t], sizeof(T), t, true);
      std::memcpy(shared_.data() + offset.v[t], &value.v[t], sizeof(T));
    }
  }

  /// cp.async.cg 16 bytes global -> shared; zero-fills when !valid (src is then not read).
  /// On the host the copy happens at once; commit/wait only order things on the device.
  void copy16_async(const lanes_of<std::uint32_t>& dst, const lanes_of<const void*>& src,
                    const lanes_of<bool>& valid) {
    for (int t = 0; t < Threads; ++t) {
      touch(dst.v[t], 16, t, true);
      if (valid.v[t])
        std::memcpy(shared_.data() + dst.v[t], src.v[t], 16);
      else
        std::memset(shared_.data() + dst.v[t], 0, 16);
    }
  }
  void commit_async() noexcept {}
  template <int Pending>
  void wait_async() noexcept {}

  /// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lane l gives the address of row l % 8 of
  /// matrix l / 8; register r of lane l receives row l / 4 of matrix r, 16-bit columns
  /// 2 (l % 4) and 2 (l % 4) + 1 (.trans: column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1).
  void ldmatrix_x4(lanes_of<std::uint32_t> (&out)[4], const lanes_of<std::uint32_t>& row_offset, bool trans) {
    for (int w = 0; w < Threads; w += warp_size)
      for (int l = 0; l < warp_size; ++l)
        for (int r = 0; r < 4; ++r) {
          std::uint16_t half[2];
          for (int h = 0; h < 2; ++h) {
            const int row = trans ? 2 * (l % 4) + h : l / 4;
            const int col = trans ? l / 4 : 2 * (l % 4) + h;
            const int source_lane = w + r * 8 + row;
            const std::uint32_t byte = row_offset.v[source_lane] + static_cast<std::uint32_t>(2 * col);
            touch(byte, 2, w + l, false);
            std::memcpy(&half[h], shared_.data() + byte, 2);
          }
          out[r].v[w + l] = static_cast<std::uint32_t>(half[0]) | (static_cast<std::uint32_t>(half[1]) << 16);
        }
  }

  /// __shfl_xor_sync(full mask, x, mask): lane l gets lane l ^ mask of its warp.
  template <class T>
  [[nodiscard]] static lanes_of<T> shfl_xor(const lanes_of<T>& x, int mask) noexcept {
    lanes_of<T> r;
    for (int t = 0; t < Threads; ++t) r.v[t] = x.v[(t & ~(warp_size - 1)) | ((t % warp_size) ^ mask)];
    return r;
  }
  /// __shfl_sync(full mask, x, source): lane l gets lane source[l] (mod 32) of its warp.
  template <class T>
  [[nodiscard]] static lanes_of<T> shfl(const lanes_of<T>& x, const lanes_of<int>& source) noexcept {
    lanes_of<T> r;
    for (int t = 0; t < Threads; ++t) r.v[t] = x.v[(t & ~(warp_size - 1)) | (source.v[t] & (warp_size - 1))];
    return r;
  }

  /// Global memory through per-thread pointers.
  template <class T>
  [[nodiscard]] static lanes_of<T> load(const lanes_of<const T*>& p, const lanes_of<bool>& active) noexcept {
    lanes_of<T> r;
    for (int t = 0; t < Threads; ++t) r.v[t] = active.v[t] ? *p.v[t] : T{};
    return r;
  }
  template <class T>
  static void store(const lanes_of<T*>& p, const lanes_of<T>& value, const lanes_of<bool>& active) noexcept {
    for (int t = 0; t < Threads; ++t)
      if (active.v[t]) *p.v[t] = value.v[t];
  }

  /// Number of sync_block() calls so far (tests count phases with it).
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

 private:
  struct word_state {
    std::uint64_t write_epoch = ~std::uint64_t{0}, read_epoch = ~std::uint64_t{0};
    int writer = -1, reader = -1;  // reader -2: several threads read it this epoch
  };

  void touch(std::uint32_t byte, std::size_t size, int thread, bool write) {
    if (byte + size > shared_.size())
      throw simt_race("baton simt: thread " + std::to_string(thread) + " accesses shared byte " + std::to_string(byte) +
                      " + " + std::to_string(size) + " past the " + std::to_string(shared_.size()) + " bytes of the block");
    if (!check_) return;
    for (std::uint32_t w = byte / 4; w < (byte + static_cast<std::uint32_t>(size) + 3) / 4; ++w) {
      word_state& s = words_[w];
      const bool written_now = s.write_epoch == epoch_;
      if (written_now && s.writer != thread) race(w, s.writer, thread, write ? "writes" : "reads");
      if (write) {
        if (s.read_epoch == epoch_ && s.reader != thread) race(w, s.reader, thread, "writes");
        s.write_epoch = epoch_;
        s.writer = thread;
      } else if (s.read_epoch != epoch_) {
        s.read_epoch = epoch_;
        s.reader = thread;
      } else if (s.reader != thread) {
        s.reader = -2;
      }
    }
  }
  [[noreturn]] void race(std::uint32_t word, int other, int thread, const char* what) const {
    throw simt_race("baton simt: shared-memory race at byte " + std::to_string(word * 4) + ": thread " +
                    std::to_string(thread) + " " + what + " a word that " +
                    (other == -2 ? std::string("several threads") : "thread " + std::to_string(other)) +
                    " accessed since the last sync_block() (a __syncthreads() is missing)");
  }

  std::vector<std::byte> shared_;
  bool check_;
  std::vector<word_state> words_;
  std::uint64_t epoch_ = 0;
};

}  // namespace baton::detail::attention::cuda::simt
