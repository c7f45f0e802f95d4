// baton/core/simd.hpp — the few vector operations baton's CPU kernels use (attention's flash
// tiles and GEMM micro-kernel, the model layer's element-wise pieces).
//
// One native vector register per value, through the GCC/Clang vector extension (so the
// compiler keeps the tile accumulators in registers rather than hoping the auto-vectoriser
// finds them), with a plain-array fallback for other compilers. Widths follow the target:
// 64 bytes with AVX-512, 32 with AVX, 16 otherwise.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#endif

namespace baton::detail::core::simd {

#if defined(__AVX512F__)
inline constexpr int vector_bytes = 64;
inline constexpr int vector_registers = 32;
#elif defined(__AVX__)
inline constexpr int vector_bytes = 32;
inline constexpr int vector_registers = 16;
#else
inline constexpr int vector_bytes = 16;
inline constexpr int vector_registers = 16;
#endif

#if defined(__GNUC__)
#define BATON_ALWAYS_INLINE inline __attribute__((always_inline))
#define BATON_NEVER_INLINE __attribute__((noinline)) inline
// Passing a 64-byte vector by value to a non-inlined function changes the psABI; every
// function here is always_inline, so GCC's note about it is noise.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float vf_t __attribute__((vector_size(vector_bytes)));
typedef double vd_t __attribute__((vector_size(vector_bytes)));
typedef std::int32_t vi32_t __attribute__((vector_size(vector_bytes)));
typedef std::int64_t vi64_t __attribute__((vector_size(vector_bytes)));

template <class T>
struct native_vector;
template <>
struct native_vector<float> {
  using type = vf_t;
  using bits = vi32_t;
};
template <>
struct native_vector<double> {
  using type = vd_t;
  using bits = vi64_t;
};
#else
#define BATON_ALWAYS_INLINE inline
#define BATON_NEVER_INLINE inline

template <class T, class E>
struct fallback_vector {
  static constexpr int n = vector_bytes / sizeof(T);
  T v[n];
  T& operator[](int i) { return v[i]; }
  T operator[](int i) const { return v[i]; }
#define BATON_SIMD_OP(op)                                                         \
  friend fallback_vector operator op(fallback_vector a, const fallback_vector& b) { \
    for (int i = 0; i < n; ++i) a.v[i] = a.v[i] op b.v[i];                        \
    return a;                                                                     \
  }                                                                               \
  friend fallback_vector operator op(fallback_vector a, T b) {                    \
    for (int i = 0; i < n; ++i) a.v[i] = a.v[i] op b;                             \
    return a;                                                                     \
  }
  BATON_SIMD_OP(+)
  BATON_SIMD_OP(-)
  BATON_SIMD_OP(*)
#undef BATON_SIMD_OP
};
template <class T>
struct native_vector {
  using type = fallback_vector<T, void>;
};
#endif

template <class T>
using vec_t = typename native_vector<T>::type;
template <class T>
inline constexpr int width_v = vector_bytes / static_cast<int>(sizeof(T));

template <class T>
BATON_ALWAYS_INLINE vec_t<T> load(const T* p) noexcept {
  vec_t<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <class T>
BATON_ALWAYS_INLINE void store(T* p, const vec_t<T>& v) noexcept {
  std::memcpy(p, &v, sizeof(v));
}
/// Keeps v in a register: the compiler may not re-load it from memory at each use (it
/// otherwise folds one load into every FMA that reads it, which makes the tile load-bound).
template <class V>
BATON_ALWAYS_INLINE void pin_register(V& v) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__AVX__)
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

template <class T>
BATON_ALWAYS_INLINE vec_t<T> broadcast(T s) noexcept {
#if defined(__GNUC__)
  return s - vec_t<T>{};  // s - 0 is s for every s (-0 too), so this folds to a plain broadcast
#else
  vec_t<T> v;
  for (int i = 0; i < width_v<T>; ++i) v[i] = s;
  return v;
#endif
}

/// a * b + c, fused where the target has FMA (independent of -ffp-contract).
template <class V>
  requires(std::is_same_v<V, vec_t<float>> || std::is_same_v<V, vec_t<double>>)
BATON_ALWAYS_INLINE V fma(const V& a, const V& b, const V& c) noexcept {
  [[maybe_unused]] constexpr bool single = std::is_same_v<V, vec_t<float>>;
#if defined(__GNUC__) && defined(__AVX512F__)
  if constexpr (single) return _mm512_fmadd_ps(a, b, c); else return _mm512_fmadd_pd(a, b, c);
#elif defined(__GNUC__) && defined(__FMA__) && defined(__AVX__)
  if constexpr (single) return _mm256_fmadd_ps(a, b, c); else return _mm256_fmadd_pd(a, b, c);
#else
  return a * b + c;
#endif
}

template <class T>
BATON_ALWAYS_INLINE vec_t<T> vmax(const vec_t<T>& a, const vec_t<T>& b) noexcept {
#if defined(__GNUC__)
  return a > b ? a : b;
#else
  vec_t<T> r;
  for (int i = 0; i < width_v<T>; ++i) r[i] = a[i] > b[i] ? a[i] : b[i];
  return r;
#endif
}
template <class T>
BATON_ALWAYS_INLINE vec_t<T> vmin(const vec_t<T>& a, const vec_t<T>& b) noexcept {
#if defined(__GNUC__)
  return a < b ? a : b;
#else
  vec_t<T> r;
  for (int i = 0; i < width_v<T>; ++i) r[i] = a[i] < b[i] ? a[i] : b[i];
  return r;
#endif
}

// Horizontal reductions: log-step shuffles where the target has them (a linear chain of 15
// dependent scalar ops per row would cost as much as a fifth of a tile's GEMMs). Written
// with plain AVX shuffles rather than _mm512_reduce_* / _mm512_extract*, whose undefined
// operand trips -Wmaybe-uninitialized inside GCC 12's own header.
#if defined(__GNUC__) && defined(__AVX__)
struct reduce_max_op {
  static __m128 f(__m128 a, __m128 b) noexcept { return _mm_max_ps(a, b); }
  static __m128d f(__m128d a, __m128d b) noexcept { return _mm_max_pd(a, b); }
};
struct reduce_add_op {
  static __m128 f(__m128 a, __m128 b) noexcept { return _mm_add_ps(a, b); }
  static __m128d f(__m128d a, __m128d b) noexcept { return _mm_add_pd(a, b); }
};
template <class Op>
BATON_ALWAYS_INLINE float reduce128(__m128 x) noexcept {
  x = Op::f(x, _mm_movehl_ps(x, x));
  x = Op::f(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}
template <class Op>
BATON_ALWAYS_INLINE double reduce128(__m128d x) noexcept {
  return _mm_cvtsd_f64(Op::f(x, _mm_unpackhi_pd(x, x)));
}
template <class Op, class T>
BATON_ALWAYS_INLINE T reduce(const vec_t<T>& v) noexcept {
  if constexpr (std::is_same_v<T, float>) {
#if defined(__AVX512F__)
    __m256 lo, hi;  // halves by memcpy: compiles to one extract, no intrinsic with an undefined operand
    std::memcpy(&lo, &v, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    const __m256 y = std::is_same_v<Op, reduce_max_op> ? _mm256_max_ps(lo, hi) : _mm256_add_ps(lo, hi);
#else
    const __m256 y = v;
#endif
    return reduce128<Op>(Op::f(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1)));
  } else {
#if defined(__AVX512F__)
    __m256d lo, hi;
    std::memcpy(&lo, &v, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    const __m256d y = std::is_same_v<Op, reduce_max_op> ? _mm256_max_pd(lo, hi) : _mm256_add_pd(lo, hi);
#else
    const __m256d y = v;
#endif
    return reduce128<Op>(Op::f(_mm256_castpd256_pd128(y), _mm256_extractf128_pd(y, 1)));
  }
}
#endif

template <class T>
BATON_ALWAYS_INLINE T hmax(const vec_t<T>& v) noexcept {
#if defined(__GNUC__) && defined(__AVX__)
  return reduce<reduce_max_op, T>(v);
#else
  T m = v[0];
  for (int i = 1; i < width_v<T>; ++i) m = v[i] > m ? v[i] : m;
  return m;
#endif
}
template <class T>
BATON_ALWAYS_INLINE T hsum(const vec_t<T>& v) noexcept {
#if defined(__GNUC__) && defined(__AVX__)
  return reduce<reduce_add_op, T>(v);
#else
  T s = v[0];
  for (int i = 1; i < width_v<T>; ++i) s += v[i];
  return s;
#endif
}

/// c[0] + c[1] x + ... + c[N-1] x^(N-1) per lane, by Horner's rule (one fma per degree).
template <class T, std::size_t N>
BATON_ALWAYS_INLINE vec_t<T> horner(vec_t<T> x, const T (&c)[N]) noexcept {
  vec_t<T> p = broadcast(c[N - 1]);
  for (std::size_t k = N - 1; k-- > 0;) p = fma(p, x, broadcast(c[k]));
  return p;
}

/// 2^f for f in [-1/2, 1/2]: exp2's polynomial (degree-7 Taylor of e^(f ln 2)). The softmax
/// tiles of the attention kernels use shorter ones (flash_tiles.hpp: exp2_scores).
BATON_ALWAYS_INLINE vec_t<float> exp2_fraction(vec_t<float> f) noexcept {
  static constexpr float c[] = {1.0f,
                                0.6931471805599453f,
                                0.2402265069591007f,
                                0.05550410866482158f,
                                0.009618129107628477f,
                                0.0013333558146428443f,
                                0.00015403530393381608f,
                                1.525273380405984e-05f};
  return horner(f, c);
}

/// x = n + f per lane, n = round(x) and f in [-1/2, 1/2]: `fraction` is f and `power` 2^n.
struct exp2_split {
  vec_t<float> fraction;
  vec_t<float> power;
};

/// Splits x, which the caller has clamped to [-127, 128], for 2^x = 2^f * 2^n. One add rounds:
/// t = x + 1.5 * 2^23 + 127 keeps no fraction, and its low mantissa bits hold n + 127, which
/// shifted into the exponent field are 2^n (0 at n = -127, +inf at 128) — no integer add.
BATON_ALWAYS_INLINE exp2_split split_exp2(vec_t<float> x) noexcept {
  const vec_t<float> shifter = broadcast(12583039.0f);  // 1.5 * 2^23 + 127
  const vec_t<float> t = x + shifter;
  exp2_split parts;
  parts.fraction = x - (t - shifter);
#if defined(__GNUC__)
  parts.power = std::bit_cast<vec_t<float>>(std::bit_cast<vi32_t>(t) << 23);
#else
  for (int i = 0; i < width_v<float>; ++i)
    parts.power[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(t[i]) << 23);
#endif
  return parts;
}

/// 2^x per lane. Inputs below the smallest normal exponent give exactly 0 (so -inf, a
/// masked score, gives 0 without a test); NaN gives 0 too. Relative error ~1e-7 (float,
/// degree-7 Taylor of e^(f ln 2) on |f| <= 1/2) and ~3e-16 (double, degree 13).
BATON_ALWAYS_INLINE vec_t<float> exp2(vec_t<float> x) noexcept {
  x = vmax<float>(x, broadcast(-127.0f));  // NaN and -inf become -127, whose power is 0
  x = vmin<float>(x, broadcast(127.0f));
  const exp2_split parts = split_exp2(x);
  return exp2_fraction(parts.fraction) * parts.power;
}

BATON_ALWAYS_INLINE vec_t<double> exp2(vec_t<double> x) noexcept {
  x = vmax<double>(x, broadcast(-1023.0));
  x = vmin<double>(x, broadcast(1023.0));
  const vec_t<double> shifter = broadcast(6755399441055744.0);  // 1.5 * 2^52
  const vec_t<double> t = x + shifter;
  const vec_t<double> n = t - shifter;
  const vec_t<double> f = x - n;
  // ln(2)^k / k!
  constexpr double c[] = {1.0,
                          0.6931471805599453094,
                          0.2402265069591007123,
                          0.05550410866482157995,
                          0.009618129107628477162,
                          0.001333355814642844343,
                          0.0001540353039338160995,
                          1.525273380405984028e-05,
                          1.321548679014430948e-06,
                          1.017808600923969859e-07,
                          7.054911620801123329e-09,
                          4.445538271870811497e-10,
                          2.567843599348820264e-11,
                          1.369148885390412482e-12};
  const vec_t<double> p = horner(f, c);
#if defined(__GNUC__)
  const vi64_t ni = std::bit_cast<vi64_t>(t) - std::bit_cast<std::int64_t>(6755399441055744.0);
  const vi64_t scale_bits = (ni + 1023) << 52;
  return p * std::bit_cast<vd_t>(scale_bits);
#else
  vec_t<double> r;
  for (int i = 0; i < width_v<double>; ++i) {
    const std::int64_t ni = static_cast<std::int64_t>(n[i]);
    r[i] = p[i] * std::bit_cast<double>(static_cast<std::int64_t>((ni + 1023) << 52));
  }
  return r;
#endif
}

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

}  // namespace baton::detail::core::simd
