// metal_emu.h -- what a Metal compute kernel needs, in standard C++20, for the CPU emulator of
// mlx_specstream.kernels (see docs/kernels.md).
//
// A kernel body written for mx.fast.metal_kernel is compiled by g++ against this header: Metal's
// scalar types (half and bfloat as 16-bit types whose every operation rounds back to 16 bits,
// like the GPU), vector types, address-space qualifiers (no-ops), the metal::, fast:: and
// precise:: math functions, threadgroup barriers, simdgroup functions over 32-lane simdgroups,
// and atomics. The Python side generates the kernel function exactly as MLX would, then calls
// mtlemu::launch, which runs the grid: every threadgroup's threads are cooperative fibers on one
// OS thread, interleaved at each barrier and simdgroup function in a chosen order (forward,
// reverse or random), so a missing barrier or a wrong lane gives a wrong answer. Threadgroup
// arrays are rewritten by the Python side into per-threadgroup storage that is poisoned (every
// byte 0xFF: NaN for floats, -1 for integers) when each threadgroup starts.
#pragma once

// Fibers switch stacks with a few lines of x86-64 assembly; elsewhere (or with
// -DMTLEMU_USE_UCONTEXT) with ucontext.
#if defined(MTLEMU_ASM_FIBERS) && !defined(MTLEMU_USE_UCONTEXT)
#define MTLEMU_ASM_FIBERS 1
#endif
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700
#define _DARWIN_C_SOURCE 1
#endif

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>
#if !defined(MTLEMU_ASM_FIBERS)
#include <ucontext.h>
#endif

// ------------------------------------------------------------------------------------------
// 16-bit floating point types
// ------------------------------------------------------------------------------------------
namespace mtlemu {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// IEEE binary16 <-> binary32, round to nearest even, with subnormals, infinities and NaNs.
inline float h2f(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    float f = float(man) * 5.9604644775390625e-8f;  // man * 2^-24
    return sign ? -f : f;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t f2h(float f) {
  uint32_t x = float_to_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or nan
    return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0u));
  }
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: overflow
  if (ax < 0x38800000u) {                                 // below the smallest normal half
    // subnormal half: value = m * 2^-24, round the float to a multiple of 2^-24
    float a = bits_to_float(ax);
    float scaled = a * 16777216.0f;  // a * 2^24, exact
    float r = std::nearbyint(scaled);  // ties to even under the default rounding mode
    return uint16_t(sign | uint32_t(r));
  }
  // normal: keep 10 mantissa bits, round to nearest even on the 13 dropped bits
  uint32_t e = ((ax >> 23) - 112u) << 10;
  uint32_t m = (ax >> 13) & 0x3ffu;
  uint32_t rest = ax & 0x1fffu;
  uint32_t h = e | m;
  if (rest > 0x1000u || (rest == 0x1000u && (m & 1u))) h += 1;  // may carry into the exponent
  return uint16_t(sign | h);
}

inline float bf2f(uint16_t b) { return bits_to_float(uint32_t(b) << 16); }

inline uint16_t f2bf(float f) {
  uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

}  // namespace mtlemu

struct bfloat;

struct half {
  uint16_t bits_;
  half() = default;
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  half(U v) : bits_(mtlemu::f2h(static_cast<float>(v))) {}
  inline half(bfloat b);
  operator float() const { return mtlemu::h2f(bits_); }
  static half from_bits(uint16_t b) {
    half h;
    h.bits_ = b;
    return h;
  }
};

struct bfloat {
  uint16_t bits_;
  bfloat() = default;
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  bfloat(U v) : bits_(mtlemu::f2bf(static_cast<float>(v))) {}
  bfloat(half h) : bits_(mtlemu::f2bf(float(h))) {}
  operator float() const { return mtlemu::bf2f(bits_); }
  static bfloat from_bits(uint16_t b) {
    bfloat h;
    h.bits_ = b;
    return h;
  }
};

inline half::half(bfloat b) : bits_(mtlemu::f2h(float(b))) {}

namespace mtlemu {
template <class T>
inline constexpr bool is16 = std::is_same_v<T, half> || std::is_same_v<T, bfloat>;
template <class T>
inline constexpr bool is_scalar = std::is_arithmetic_v<T> || is16<T>;

// Metal's usual arithmetic conversions for expressions with a 16-bit float operand.
template <class A, class B>
struct promote16 {
  using type = std::conditional_t<
      std::is_same_v<A, B>, A,
      std::conditional_t<
          std::is_floating_point_v<A> || std::is_floating_point_v<B> || (is16<A> && is16<B>), float,
          std::conditional_t<is16<A>, A, B>>>;
};
template <class A, class B>
using promote16_t = typename promote16<A, B>::type;
template <class A, class B>
inline constexpr bool mixed16 = (is16<A> || is16<B>) && is_scalar<A> && is_scalar<B>;
}  // namespace mtlemu

#define MTLEMU_BINOP16(op)                                                          \
  template <class A, class B, std::enable_if_t<mtlemu::mixed16<A, B>, int> = 0>     \
  inline mtlemu::promote16_t<A, B> operator op(A a, B b) {                          \
    return mtlemu::promote16_t<A, B>(static_cast<float>(a) op static_cast<float>(b)); \
  }
MTLEMU_BINOP16(+)
MTLEMU_BINOP16(-)
MTLEMU_BINOP16(*)
MTLEMU_BINOP16(/)
#undef MTLEMU_BINOP16

#define MTLEMU_CMP16(op)                                                        \
  template <class A, class B, std::enable_if_t<mtlemu::mixed16<A, B>, int> = 0> \
  inline bool operator op(A a, B b) {                                           \
    return static_cast<float>(a) op static_cast<float>(b);                      \
  }
MTLEMU_CMP16(==)
MTLEMU_CMP16(!=)
MTLEMU_CMP16(<)
MTLEMU_CMP16(<=)
MTLEMU_CMP16(>)
MTLEMU_CMP16(>=)
#undef MTLEMU_CMP16

#define MTLEMU_ASSIGN16(T, op)                                                     \
  template <class B, std::enable_if_t<mtlemu::is_scalar<B>, int> = 0>              \
  inline T& operator op##=(T & a, B b) {                                           \
    a = T(static_cast<float>(a) op static_cast<float>(b));                         \
    return a;                                                                      \
  }
MTLEMU_ASSIGN16(half, +)
MTLEMU_ASSIGN16(half, -)
MTLEMU_ASSIGN16(half, *)
MTLEMU_ASSIGN16(half, /)
MTLEMU_ASSIGN16(bfloat, +)
MTLEMU_ASSIGN16(bfloat, -)
MTLEMU_ASSIGN16(bfloat, *)
MTLEMU_ASSIGN16(bfloat, /)
#undef MTLEMU_ASSIGN16

inline half operator-(half a) { return half::from_bits(uint16_t(a.bits_ ^ 0x8000u)); }
inline half operator+(half a) { return a; }
inline bfloat operator-(bfloat a) { return bfloat::from_bits(uint16_t(a.bits_ ^ 0x8000u)); }
inline bfloat operator+(bfloat a) { return a; }
inline half& operator++(half& a) { return a += 1; }
inline half& operator--(half& a) { return a -= 1; }

namespace std {
template <>
struct numeric_limits<half> {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false;
  static constexpr bool has_infinity = true, has_quiet_NaN = true;
  static constexpr int digits = 11;
  static half min() { return half::from_bits(0x0400); }
  static half max() { return half::from_bits(0x7bff); }
  static half lowest() { return half::from_bits(0xfbff); }
  static half epsilon() { return half::from_bits(0x1400); }
  static half infinity() { return half::from_bits(0x7c00); }
  static half quiet_NaN() { return half::from_bits(0x7e00); }
  static half denorm_min() { return half::from_bits(0x0001); }
};
template <>
struct numeric_limits<bfloat> {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false;
  static constexpr bool has_infinity = true, has_quiet_NaN = true;
  static constexpr int digits = 8;
  static bfloat min() { return bfloat::from_bits(0x0080); }
  static bfloat max() { return bfloat::from_bits(0x7f7f); }
  static bfloat lowest() { return bfloat::from_bits(0xff7f); }
  static bfloat epsilon() { return bfloat::from_bits(0x3c00); }
  static bfloat infinity() { return bfloat::from_bits(0x7f80); }
  static bfloat quiet_NaN() { return bfloat::from_bits(0x7fc0); }
  static bfloat denorm_min() { return bfloat::from_bits(0x0001); }
};
}  // namespace std

// ------------------------------------------------------------------------------------------
// Vector types
// ------------------------------------------------------------------------------------------
namespace metal {

template <class T, int N>
struct vec;

namespace detail {
template <class T>
struct ncomp {
  static constexpr int value = 1;
};
template <class T, int N>
struct ncomp<vec<T, N>> {
  static constexpr int value = N;
};
template <class T, class A>
inline void put(T* p, int& i, const A& a) {
  if constexpr (ncomp<A>::value == 1) {
    p[i++] = T(a);
  } else {
    for (int k = 0; k < ncomp<A>::value; ++k) p[i++] = T(a[k]);
  }
}
template <class T>
inline constexpr bool is_vec = false;
template <class T, int N>
inline constexpr bool is_vec<vec<T, N>> = true;
}  // namespace detail

#define MTLEMU_VEC_COMMON(N)                                                                    \
  vec() = default;                                                                              \
  template <class S, std::enable_if_t<mtlemu::is_scalar<S>, int> = 0>                           \
  vec(S s) {                                                                                    \
    for (int i = 0; i < N; ++i) (*this)[i] = T(s);                                              \
  }                                                                                             \
  template <class A0, class A1, class... As,                                                    \
            std::enable_if_t<(detail::ncomp<A0>::value + detail::ncomp<A1>::value +             \
                              (0 + ... + detail::ncomp<As>::value)) == N,                       \
                             int> = 0>                                                          \
  vec(const A0& a0, const A1& a1, const As&... as) {                                            \
    int i = 0;                                                                                  \
    T* p = &(*this)[0];                                                                         \
    detail::put(p, i, a0);                                                                      \
    detail::put(p, i, a1);                                                                      \
    (detail::put(p, i, as), ...);                                                               \
  }                                                                                             \
  template <class U>                                                                            \
  explicit vec(const vec<U, N>& o) {                                                            \
    for (int i = 0; i < N; ++i) (*this)[i] = T(o[i]);                                           \
  }                                                                                             \
  T& operator[](int i) { return (&x)[i]; }                                                      \
  const T& operator[](int i) const { return (&x)[i]; }

template <class T>
struct alignas(2 * sizeof(T)) vec<T, 2> {
  T x, y;
  MTLEMU_VEC_COMMON(2)
};
template <class T>
struct alignas(4 * sizeof(T)) vec<T, 3> {
  T x, y, z;
  MTLEMU_VEC_COMMON(3)
};
template <class T>
struct alignas(4 * sizeof(T)) vec<T, 4> {
  T x, y, z, w;
  MTLEMU_VEC_COMMON(4)
};
#undef MTLEMU_VEC_COMMON

#define MTLEMU_VEC_BINOP(op)                                                              \
  template <class T, int N>                                                               \
  inline auto operator op(const vec<T, N>& a, const vec<T, N>& b) {                       \
    using R = decltype(a[0] op b[0]);                                                     \
    vec<std::conditional_t<std::is_same_v<R, bool>, bool, T>, N> r;                       \
    for (int i = 0; i < N; ++i) r[i] = a[i] op b[i];                                      \
    return r;                                                                             \
  }                                                                                       \
  template <class T, int N, class S, std::enable_if_t<mtlemu::is_scalar<S>, int> = 0>     \
  inline auto operator op(const vec<T, N>& a, S s) {                                      \
    return a op vec<T, N>(T(s));                                                          \
  }                                                                                       \
  template <class T, int N, class S, std::enable_if_t<mtlemu::is_scalar<S>, int> = 0>     \
  inline auto operator op(S s, const vec<T, N>& a) {                                      \
    return vec<T, N>(T(s)) op a;                                                          \
  }
MTLEMU_VEC_BINOP(+)
MTLEMU_VEC_BINOP(-)
MTLEMU_VEC_BINOP(*)
MTLEMU_VEC_BINOP(/)
MTLEMU_VEC_BINOP(%)
MTLEMU_VEC_BINOP(&)
MTLEMU_VEC_BINOP(|)
MTLEMU_VEC_BINOP(^)
MTLEMU_VEC_BINOP(<<)
MTLEMU_VEC_BINOP(>>)
MTLEMU_VEC_BINOP(==)
MTLEMU_VEC_BINOP(!=)
MTLEMU_VEC_BINOP(<)
MTLEMU_VEC_BINOP(<=)
MTLEMU_VEC_BINOP(>)
MTLEMU_VEC_BINOP(>=)
MTLEMU_VEC_BINOP(&&)
MTLEMU_VEC_BINOP(||)
#undef MTLEMU_VEC_BINOP

#define MTLEMU_VEC_ASSIGN(op)                                  \
  template <class T, int N, class B>                           \
  inline vec<T, N>& operator op##=(vec<T, N> & a, const B& b) { \
    a = vec<T, N>(a op b);                                     \
    return a;                                                  \
  }
MTLEMU_VEC_ASSIGN(+)
MTLEMU_VEC_ASSIGN(-)
MTLEMU_VEC_ASSIGN(*)
MTLEMU_VEC_ASSIGN(/)
MTLEMU_VEC_ASSIGN(%)
MTLEMU_VEC_ASSIGN(&)
MTLEMU_VEC_ASSIGN(|)
MTLEMU_VEC_ASSIGN(^)
MTLEMU_VEC_ASSIGN(<<)
MTLEMU_VEC_ASSIGN(>>)
#undef MTLEMU_VEC_ASSIGN

template <class T, int N>
inline vec<T, N> operator-(const vec<T, N>& a) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = -a[i];
  return r;
}
template <class T, int N>
inline vec<T, N> operator+(const vec<T, N>& a) {
  return a;
}
template <class T, int N>
inline vec<T, N> operator~(const vec<T, N>& a) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = ~a[i];
  return r;
}
template <class T, int N>
inline vec<bool, N> operator!(const vec<T, N>& a) {
  vec<bool, N> r;
  for (int i = 0; i < N; ++i) r[i] = !a[i];
  return r;
}
template <int N>
inline bool all(const vec<bool, N>& a) {
  for (int i = 0; i < N; ++i)
    if (!a[i]) return false;
  return true;
}
template <int N>
inline bool any(const vec<bool, N>& a) {
  for (int i = 0; i < N; ++i)
    if (a[i]) return true;
  return false;
}
inline bool all(bool a) { return a; }
inline bool any(bool a) { return a; }

}  // namespace metal

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef half float16_t;
typedef bfloat bfloat16_t;

#define MTLEMU_VEC_ALIASES(T, name)   \
  typedef metal::vec<T, 2> name##2;   \
  typedef metal::vec<T, 3> name##3;   \
  typedef metal::vec<T, 4> name##4;   \
  typedef metal::vec<T, 4> packed_##name##4; \
  typedef metal::vec<T, 2> packed_##name##2;
MTLEMU_VEC_ALIASES(float, float)
MTLEMU_VEC_ALIASES(half, half)
MTLEMU_VEC_ALIASES(bfloat, bfloat)
MTLEMU_VEC_ALIASES(int, int)
MTLEMU_VEC_ALIASES(uint, uint)
MTLEMU_VEC_ALIASES(short, short)
MTLEMU_VEC_ALIASES(ushort, ushort)
MTLEMU_VEC_ALIASES(char, char)
MTLEMU_VEC_ALIASES(uchar, uchar)
MTLEMU_VEC_ALIASES(bool, bool)
MTLEMU_VEC_ALIASES(long, long)
MTLEMU_VEC_ALIASES(ulong, ulong)
#undef MTLEMU_VEC_ALIASES

// ------------------------------------------------------------------------------------------
// Math (metal::, metal::fast::, metal::precise::)
// ------------------------------------------------------------------------------------------
namespace metal {

template <class T>
struct numeric_limits : std::numeric_limits<T> {};

template <class To, class From>
inline To as_type(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  To t;
  std::memcpy(&t, &f, sizeof(To));
  return t;
}

#define MTLEMU_MATH_FUNCS(X)                                                                     \
  X(exp) X(exp2) X(log) X(log2) X(log10) X(sqrt) X(sin) X(cos) X(tan) X(asin) X(acos) X(atan)    \
  X(sinh) X(cosh) X(tanh) X(asinh) X(acosh) X(atanh) X(floor) X(ceil) X(round) X(trunc) X(rint) \
  X(fabs) X(log1p) X(expm1) X(cbrt)

#define MTLEMU_UNARY(f)                                                                   \
  using std::f;                                                                           \
  inline half f(half x) { return half(std::f(float(x))); }                                \
  inline bfloat f(bfloat x) { return bfloat(std::f(float(x))); }                          \
  template <class T, int N>                                                               \
  inline vec<T, N> f(const vec<T, N>& v) {                                                \
    vec<T, N> r;                                                                          \
    for (int i = 0; i < N; ++i) r[i] = f(v[i]);                                           \
    return r;                                                                             \
  }
MTLEMU_MATH_FUNCS(MTLEMU_UNARY)
#undef MTLEMU_UNARY

#define MTLEMU_UNARY_DEF(f, expr)                                                         \
  inline float f(float x) { return expr; }                                                \
  inline half f(half x) { return half(f(float(x))); }                                     \
  inline bfloat f(bfloat x) { return bfloat(f(float(x))); }                               \
  template <class T, int N>                                                               \
  inline vec<T, N> f(const vec<T, N>& v) {                                                \
    vec<T, N> r;                                                                          \
    for (int i = 0; i < N; ++i) r[i] = f(v[i]);                                           \
    return r;                                                                             \
  }
MTLEMU_UNARY_DEF(rsqrt, 1.0f / std::sqrt(x))
MTLEMU_UNARY_DEF(exp10, std::pow(10.0f, x))
MTLEMU_UNARY_DEF(fract, std::fmin(x - std::floor(x), 0x1.fffffep-1f))
MTLEMU_UNARY_DEF(saturate, std::fmin(std::fmax(x, 0.0f), 1.0f))
MTLEMU_UNARY_DEF(sign, (x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (std::isnan(x) ? 0.0f : x))))
MTLEMU_UNARY_DEF(sinpi, std::sin(x * 3.14159265358979f))
MTLEMU_UNARY_DEF(cospi, std::cos(x * 3.14159265358979f))
#undef MTLEMU_UNARY_DEF

#define MTLEMU_BINARY(f, expr)                                                            \
  inline float f(float x, float y) { return expr; }                                       \
  inline half f(half x, half y) { return half(f(float(x), float(y))); }                   \
  inline bfloat f(bfloat x, bfloat y) { return bfloat(f(float(x), float(y))); }           \
  template <class T, int N>                                                               \
  inline vec<T, N> f(const vec<T, N>& a, const vec<T, N>& b) {                            \
    vec<T, N> r;                                                                          \
    for (int i = 0; i < N; ++i) r[i] = f(a[i], b[i]);                                     \
    return r;                                                                             \
  }
MTLEMU_BINARY(pow, std::pow(x, y))
MTLEMU_BINARY(powr, std::pow(x, y))
MTLEMU_BINARY(atan2, std::atan2(x, y))
MTLEMU_BINARY(fmod, std::fmod(x, y))
MTLEMU_BINARY(fmin, std::fmin(x, y))
MTLEMU_BINARY(fmax, std::fmax(x, y))
MTLEMU_BINARY(copysign, std::copysign(x, y))
MTLEMU_BINARY(step, (y < x ? 0.0f : 1.0f))
MTLEMU_BINARY(divide, x / y)
#undef MTLEMU_BINARY

// min/max/abs/clamp: integers compare, floating types follow fmin/fmax (a NaN loses).
template <class T, std::enable_if_t<mtlemu::is_scalar<T>, int> = 0>
inline T min(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return b < a ? b : a;
  } else {
    return T(std::fmin(float(a), float(b)));
  }
}
template <class T, std::enable_if_t<mtlemu::is_scalar<T>, int> = 0>
inline T max(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return a < b ? b : a;
  } else {
    return T(std::fmax(float(a), float(b)));
  }
}
template <class T, std::enable_if_t<mtlemu::is_scalar<T>, int> = 0>
inline T abs(T a) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    return a < 0 ? T(-a) : a;
  } else if constexpr (std::is_integral_v<T>) {
    return a;
  } else {
    return T(std::fabs(float(a)));
  }
}
template <class T, std::enable_if_t<mtlemu::is_scalar<T>, int> = 0>
inline T clamp(T x, T lo, T hi) {
  return min(max(x, lo), hi);
}
template <class T, int N>
inline vec<T, N> min(const vec<T, N>& a, const vec<T, N>& b) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = min(a[i], b[i]);
  return r;
}
template <class T, int N>
inline vec<T, N> max(const vec<T, N>& a, const vec<T, N>& b) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = max(a[i], b[i]);
  return r;
}
template <class T, int N>
inline vec<T, N> abs(const vec<T, N>& a) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = abs(a[i]);
  return r;
}
template <class T, int N>
inline vec<T, N> clamp(const vec<T, N>& x, const vec<T, N>& lo, const vec<T, N>& hi) {
  return min(max(x, lo), hi);
}
template <class T>
inline T mix(T x, T y, T a) {
  return x + (y - x) * a;
}
template <class T>
inline T fma(T a, T b, T c) {
  if constexpr (mtlemu::is_scalar<T>) {
    return T(std::fma(float(a), float(b), float(c)));
  } else {
    return a * b + c;
  }
}
template <class T>
inline T select(T a, T b, bool c) {
  return c ? b : a;
}
template <class T, int N>
inline vec<T, N> select(const vec<T, N>& a, const vec<T, N>& b, const vec<bool, N>& c) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = c[i] ? b[i] : a[i];
  return r;
}
template <class T, std::enable_if_t<mtlemu::is_scalar<T>, int> = 0>
inline bool isnan(T x) {
  return std::isnan(float(x));
}
template <class T, std::enable_if_t<mtlemu::is_scalar<T>, int> = 0>
inline bool isinf(T x) {
  return std::isinf(float(x));
}
template <class T, std::enable_if_t<mtlemu::is_scalar<T>, int> = 0>
inline bool isfinite(T x) {
  return std::isfinite(float(x));
}
template <class T, std::enable_if_t<mtlemu::is_scalar<T>, int> = 0>
inline bool signbit(T x) {
  return std::signbit(float(x));
}
template <class T, int N>
inline T dot(const vec<T, N>& a, const vec<T, N>& b) {
  T s = a[0] * b[0];
  for (int i = 1; i < N; ++i) s = s + a[i] * b[i];
  return s;
}
template <class T, int N>
inline T length(const vec<T, N>& a) {
  return T(std::sqrt(float(dot(a, a))));
}
template <class T, int N>
inline vec<T, N> normalize(const vec<T, N>& a) {
  return a * T(1.0f / float(length(a)));
}

namespace fast {
using metal::abs;
using metal::clamp;
using metal::cos;
using metal::divide;
using metal::exp;
using metal::exp10;
using metal::exp2;
using metal::fabs;
using metal::floor;
using metal::fmax;
using metal::fmin;
using metal::log;
using metal::log2;
using metal::max;
using metal::min;
using metal::pow;
using metal::powr;
using metal::rsqrt;
using metal::sin;
using metal::sqrt;
using metal::tanh;
}  // namespace fast
namespace precise {
using namespace metal::fast;
using metal::atan2;
using metal::fmod;
using metal::tan;
}  // namespace precise

}  // namespace metal

// ------------------------------------------------------------------------------------------
// The runtime: fibers, threadgroups, barriers and simdgroup exchanges
// ------------------------------------------------------------------------------------------
namespace mtlemu {

constexpr int kSimdWidth = 32;
constexpr int kMaxThreads = 1024;
constexpr int kMaxThreadgroupMemory = 32768;
constexpr int kSlot = 32;  // bytes a lane can exchange in one simdgroup function

class KernelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ThreadAttrs {
  uint dispatch_quadgroups_per_threadgroup;
  uint dispatch_simdgroups_per_threadgroup;
  uint3 dispatch_threads_per_threadgroup;
  uint3 grid_origin;
  uint3 grid_size;
  uint quadgroup_index_in_threadgroup;
  uint quadgroups_per_threadgroup;
  uint simdgroup_index_in_threadgroup;
  uint simdgroups_per_threadgroup;
  uint thread_execution_width;
  uint thread_index_in_quadgroup;
  uint thread_index_in_simdgroup;
  uint thread_index_in_threadgroup;
  uint3 thread_position_in_grid;
  uint3 thread_position_in_threadgroup;
  uint3 threadgroup_position_in_grid;
  uint3 threadgroups_per_grid;
  uint3 threads_per_grid;
  uint threads_per_simdgroup;
  uint3 threads_per_threadgroup;
};

enum FiberState : int { F_READY = 0, F_TGBAR = 1, F_SIMD = 2, F_DONE = 3 };

struct Worker;

struct Fiber {
  void* sp = nullptr;
  int state = F_DONE;
  int index = 0;
  int lane = 0;
  int sg = 0;
  int op = 0;
  const void* type = nullptr;
  int bank = 0;
  ThreadAttrs attrs{};
  Worker* worker = nullptr;
#if !defined(MTLEMU_ASM_FIBERS)
  ucontext_t ctx;
#endif
};

struct SimdState {
  alignas(32) unsigned char data[2][kSimdWidth][kSlot];
  uint32_t active[2];
  uint32_t gen;
};

using Invoker = void (*)(void* fn, const ThreadAttrs& attrs);

inline std::atomic<uint64_t> worker_ids{1};

struct Worker {
  uint64_t id = worker_ids.fetch_add(1);
  void* sched_sp = nullptr;
#if !defined(MTLEMU_ASM_FIBERS)
  ucontext_t sched_ctx;
#endif
  std::vector<Fiber> fibers;
  std::vector<char*> stacks;
  size_t stack_size = 0;
  std::vector<SimdState> sgs;
  Fiber* cur = nullptr;
  Invoker invoke = nullptr;
  void* fn = nullptr;
  std::string error;  // the first error raised inside a fiber of the current group
  std::vector<std::pair<void*, size_t>> tg_regions;
  size_t tg_bytes = 0;
  ~Worker() {
    for (char* s : stacks) munmap(s, stack_size);
  }
};

inline thread_local Worker* tl_worker = nullptr;

[[noreturn]] inline void fail(const std::string& msg) { throw KernelError(msg); }

inline Fiber* current_fiber() {
  Worker* w = tl_worker;
  if (w == nullptr || w->cur == nullptr)
    fail("a Metal synchronization function was called outside the emulator");
  return w->cur;
}

}  // namespace mtlemu

extern "C" void mtlemu_fiber_entry(mtlemu::Fiber* f) __attribute__((visibility("hidden")));

#if defined(MTLEMU_ASM_FIBERS)
// Switch stacks: save the callee-saved registers, MXCSR and the x87 control word on the current
// stack, store the stack pointer in *save, load `to` and restore the same from there.
extern "C" void mtlemu_swap(void** save, void* to) __attribute__((visibility("hidden")));
extern "C" void mtlemu_fiber_start() __attribute__((visibility("hidden")));
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".globl mtlemu_swap\n"
    ".hidden mtlemu_swap\n"
    ".type mtlemu_swap,@function\n"
    "mtlemu_swap:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  subq $8, %rsp\n"
    "  stmxcsr (%rsp)\n"
    "  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n"
    "  fldcw 4(%rsp)\n"
    "  addq $8, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size mtlemu_swap, .-mtlemu_swap\n"
    ".p2align 4\n"
    ".globl mtlemu_fiber_start\n"
    ".hidden mtlemu_fiber_start\n"
    ".type mtlemu_fiber_start,@function\n"
    "mtlemu_fiber_start:\n"
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    ".size mtlemu_fiber_start, .-mtlemu_fiber_start\n");
#endif

namespace mtlemu {

inline void to_scheduler(Fiber* f) {
#if defined(MTLEMU_ASM_FIBERS)
  mtlemu_swap(&f->sp, f->worker->sched_sp);
#else
  swapcontext(&f->ctx, &f->worker->sched_ctx);
#endif
}

inline void resume(Worker* w, Fiber* f) {
  w->cur = f;
#if defined(MTLEMU_ASM_FIBERS)
  mtlemu_swap(&w->sched_sp, f->sp);
#else
  swapcontext(&w->sched_ctx, &f->ctx);
#endif
  w->cur = nullptr;
}

#if !defined(MTLEMU_ASM_FIBERS)
inline void ucontext_entry(unsigned hi, unsigned lo) {
  uintptr_t p = (uintptr_t(hi) << 32) | uintptr_t(lo);
  mtlemu_fiber_entry(reinterpret_cast<Fiber*>(p));
}
#endif

inline void prepare_fiber(Worker* w, Fiber* f, char* stack) {
  f->worker = w;
#if defined(MTLEMU_ASM_FIBERS)
  uintptr_t top = (uintptr_t(stack) + w->stack_size) & ~uintptr_t(15);
  uint64_t* sp = reinterpret_cast<uint64_t*>(top - 64);
  uint32_t mxcsr = 0x1f80;
  uint16_t fpucw = 0x037f;
  std::memset(sp, 0, 8);
  std::memcpy(sp, &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(sp) + 4, &fpucw, 2);
  sp[1] = 0;                                             // r15
  sp[2] = 0;                                             // r14
  sp[3] = reinterpret_cast<uint64_t>(&mtlemu_fiber_entry);  // r13
  sp[4] = reinterpret_cast<uint64_t>(f);                 // r12
  sp[5] = 0;                                             // rbx
  sp[6] = 0;                                             // rbp
  sp[7] = reinterpret_cast<uint64_t>(&mtlemu_fiber_start);  // return address
  f->sp = sp;
#else
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = stack + 4096;
  f->ctx.uc_stack.ss_size = w->stack_size - 4096;
  f->ctx.uc_link = nullptr;
  uintptr_t p = reinterpret_cast<uintptr_t>(f);
  makecontext(&f->ctx, (void (*)())ucontext_entry, 2, unsigned(p >> 32), unsigned(p & 0xffffffffu));
#endif
}

// ---- threadgroup memory -------------------------------------------------------------------
// `threadgroup T name[N];` in a kernel becomes `auto& name = tg_storage<T[N], id>();`: one
// instance per OS worker thread, and a worker runs one threadgroup at a time, so every thread of
// a group sees the same storage and different groups never share it.
// (Builds use hidden visibility and -fno-gnu-unique, so that these statics are not merged across
// the kernel libraries loaded in one process.)
template <class T, int ID>
inline T& tg_storage() {
  alignas(64) static thread_local unsigned char buf[sizeof(T)];
  static thread_local uint64_t registered_with = 0;  // id of the worker (launch) it belongs to
  Worker* w = tl_worker;
  if (w == nullptr || registered_with != w->id) {
    registered_with = w ? w->id : 0;
    std::memset(buf, 0xff, sizeof(T));
    if (w) {
      w->tg_regions.emplace_back(buf, sizeof(T));
      w->tg_bytes += sizeof(T);
      if (w->tg_bytes > size_t(kMaxThreadgroupMemory))
        fail("threadgroup memory of " + std::to_string(w->tg_bytes) +
             " bytes exceeds Metal's limit of 32768 bytes");
    }
  }
  return *reinterpret_cast<T*>(buf);
}

// ---- barriers and simdgroup exchanges ------------------------------------------------------
enum SimdOp : int {
  OP_SUM = 1, OP_PRODUCT, OP_MIN, OP_MAX, OP_AND, OP_OR, OP_XOR, OP_PSUM_INC, OP_PSUM_EXC,
  OP_PPROD_INC, OP_PPROD_EXC, OP_SHUFFLE, OP_SHUFFLE_UP, OP_SHUFFLE_DOWN, OP_SHUFFLE_XOR,
  OP_ROTATE_UP, OP_ROTATE_DOWN, OP_BROADCAST, OP_BROADCAST_FIRST, OP_ALL, OP_ANY, OP_BALLOT,
  OP_IS_FIRST, OP_ACTIVE_MASK, OP_SG_BARRIER, OP_QUAD_SUM, OP_QUAD_MAX, OP_QUAD_MIN,
  OP_QUAD_SHUFFLE, OP_QUAD_SHUFFLE_XOR, OP_QUAD_BROADCAST
};

inline const char* op_name(int op) {
  static const char* names[] = {"?", "simd_sum", "simd_product", "simd_min", "simd_max", "simd_and",
                                "simd_or", "simd_xor", "simd_prefix_inclusive_sum",
                                "simd_prefix_exclusive_sum", "simd_prefix_inclusive_product",
                                "simd_prefix_exclusive_product", "simd_shuffle", "simd_shuffle_up",
                                "simd_shuffle_down", "simd_shuffle_xor", "simd_shuffle_rotate_up",
                                "simd_shuffle_rotate_down", "simd_broadcast", "simd_broadcast_first",
                                "simd_all", "simd_any", "simd_ballot", "simd_is_first",
                                "simd_active_threads_mask", "simdgroup_barrier", "quad_sum",
                                "quad_max", "quad_min", "quad_shuffle", "quad_shuffle_xor",
                                "quad_broadcast"};
  return (op > 0 && op < int(sizeof(names) / sizeof(names[0]))) ? names[op] : "?";
}

template <class T>
struct TypeTag {
  static constexpr char id = 0;
};

inline void threadgroup_barrier_impl() {
  Fiber* f = current_fiber();
  f->state = F_TGBAR;
  to_scheduler(f);
}

// What a lane sees after a simdgroup exchange: every active lane's deposited value.
template <class T>
struct Exchanged {
  const SimdState* sg;
  int bank;
  uint32_t active;
  int lane;
  bool has(int l) const { return l >= 0 && l < kSimdWidth && ((active >> l) & 1u); }
  T at(int l) const {
    T v;
    std::memcpy(&v, sg->data[bank][l], sizeof(T));
    return v;
  }
  T get_or_poison(int l) const {
    if (has(l)) return at(l);
    T v;
    std::memset(&v, 0xff, sizeof(T));
    return v;
  }
};

template <class T>
inline Exchanged<T> exchange(const T& value, int op) {
  static_assert(sizeof(T) <= kSlot, "simdgroup function on a type larger than 32 bytes");
  static_assert(std::is_trivially_copyable_v<T>, "simdgroup function on a non-trivial type");
  Fiber* f = current_fiber();
  SimdState& sg = f->worker->sgs[f->sg];
  int bank = int(sg.gen & 1u);
  std::memcpy(sg.data[bank][f->lane], &value, sizeof(T));
  f->op = op;
  f->type = &TypeTag<T>::id;
  f->bank = bank;
  f->state = F_SIMD;
  to_scheduler(f);
  return Exchanged<T>{&sg, bank, sg.active[bank], f->lane};
}

// ---- the scheduler -------------------------------------------------------------------------
struct LaunchConfig {
  long long grid[3];
  long long tg[3];
  long long workers;
  long long schedule;  // 0 forward, 1 reverse, 2 random, 3 simdgroups, 4 simdgroups-reverse
  long long seed;
  long long stack_kb;
};

inline void ensure_fibers(Worker* w, int n, size_t stack_size) {
  if (int(w->fibers.size()) < n) w->fibers.resize(n);
  w->stack_size = stack_size;
  while (int(w->stacks.size()) < n) {
    void* p = mmap(nullptr, stack_size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("could not allocate a fiber stack");
    mprotect(p, 4096, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
    w->stacks.push_back(static_cast<char*>(p));
  }
}

inline uint ceil_div(uint a, uint b) { return (a + b - 1) / b; }

// Runs one threadgroup to completion; returns an error message or "".
inline std::string run_group(Worker* w, const LaunchConfig& cfg, long long gindex, std::mt19937_64& rng) {
  uint gd[3], ng[3], gp[3], ad[3];
  for (int d = 0; d < 3; ++d) {
    gd[d] = uint(std::min(cfg.tg[d], cfg.grid[d]));
    ng[d] = ceil_div(uint(cfg.grid[d]), gd[d]);
  }
  gp[0] = uint(gindex % ng[0]);
  gp[1] = uint((gindex / ng[0]) % ng[1]);
  gp[2] = uint(gindex / (long long)(ng[0] * ng[1]));
  for (int d = 0; d < 3; ++d) ad[d] = std::min(gd[d], uint(cfg.grid[d]) - gp[d] * gd[d]);
  int n = int(ad[0] * ad[1] * ad[2]);
  int n_sg = int(ceil_div(uint(n), kSimdWidth));
  ensure_fibers(w, n, size_t(cfg.stack_kb) * 1024);
  if (int(w->sgs.size()) < n_sg) w->sgs.resize(n_sg);
  for (int s = 0; s < n_sg; ++s) {
    w->sgs[s].gen = 0;
    w->sgs[s].active[0] = w->sgs[s].active[1] = 0;
  }
  for (auto& r : w->tg_regions) std::memset(r.first, 0xff, r.second);
  w->error.clear();
  uint dispatch_n = gd[0] * gd[1] * gd[2];
  for (int t = 0; t < n; ++t) {
    Fiber* f = &w->fibers[t];
    ThreadAttrs& a = f->attrs;
    uint lx = uint(t) % ad[0], ly = (uint(t) / ad[0]) % ad[1], lz = uint(t) / (ad[0] * ad[1]);
    a.dispatch_quadgroups_per_threadgroup = ceil_div(dispatch_n, 4);
    a.dispatch_simdgroups_per_threadgroup = ceil_div(dispatch_n, kSimdWidth);
    a.dispatch_threads_per_threadgroup = uint3(gd[0], gd[1], gd[2]);
    a.grid_origin = uint3(0u, 0u, 0u);
    a.grid_size = uint3(uint(cfg.grid[0]), uint(cfg.grid[1]), uint(cfg.grid[2]));
    a.quadgroup_index_in_threadgroup = uint(t) / 4;
    a.quadgroups_per_threadgroup = ceil_div(uint(n), 4);
    a.simdgroup_index_in_threadgroup = uint(t) / kSimdWidth;
    a.simdgroups_per_threadgroup = uint(n_sg);
    a.thread_execution_width = kSimdWidth;
    a.thread_index_in_quadgroup = uint(t) % 4;
    a.thread_index_in_simdgroup = uint(t) % kSimdWidth;
    a.thread_index_in_threadgroup = uint(t);
    a.thread_position_in_grid = uint3(gp[0] * gd[0] + lx, gp[1] * gd[1] + ly, gp[2] * gd[2] + lz);
    a.thread_position_in_threadgroup = uint3(lx, ly, lz);
    a.threadgroup_position_in_grid = uint3(gp[0], gp[1], gp[2]);
    a.threadgroups_per_grid = uint3(ng[0], ng[1], ng[2]);
    a.threads_per_grid = a.grid_size;
    a.threads_per_simdgroup = kSimdWidth;
    a.threads_per_threadgroup = uint3(ad[0], ad[1], ad[2]);
    f->index = t;
    f->lane = t % kSimdWidth;
    f->sg = t / kSimdWidth;
    f->state = F_READY;
    prepare_fiber(w, f, w->stacks[t]);
  }
  std::vector<int> order(n);
  for (int t = 0; t < n; ++t) order[t] = cfg.schedule == 1 ? n - 1 - t : t;
  auto where = [&](int t) {
    const ThreadAttrs& a = w->fibers[t].attrs;
    char buf[160];
    std::snprintf(buf, sizeof(buf), " (threadgroup (%u, %u, %u), thread %d)",
                  a.threadgroup_position_in_grid.x, a.threadgroup_position_in_grid.y,
                  a.threadgroup_position_in_grid.z, t);
    return std::string(buf);
  };
  // Completes simdgroup s's simdgroup function once every live lane waits at it: 1 when it did,
  // 0 when not, -1 (err set) when lanes wait at different ones.
  std::string err;
  auto complete = [&](int s) -> int {
    int lo = s * kSimdWidth, hi = std::min(n, lo + kSimdWidth);
    uint32_t mask = 0;
    int op = 0;
    const void* type = nullptr;
    for (int t = lo; t < hi; ++t) {
      Fiber* f = &w->fibers[t];
      if (f->state == F_READY) return 0;  // a lane still on its way
      if (f->state != F_SIMD) continue;
      if (mask == 0) {
        op = f->op;
        type = f->type;
      } else if (f->op != op || f->type != type) {
        err = std::string("divergent simdgroup functions: lanes of simdgroup ") + std::to_string(s) +
              " wait at " + op_name(op) + " and at " + op_name(f->op) +
              (f->op == op ? " on different types" : "") + where(t);
        return -1;
      }
      mask |= 1u << (t - lo);
    }
    if (mask == 0) return 0;
    SimdState& sg = w->sgs[s];
    sg.active[sg.gen & 1u] = mask;
    sg.gen += 1;
    for (int t = lo; t < hi; ++t)
      if (w->fibers[t].state == F_SIMD) w->fibers[t].state = F_READY;
    return 1;
  };
  for (;;) {
    if (cfg.schedule >= 3) {
      // simdgroups one after another, each run to its next threadgroup barrier (or its end) before
      // the next starts: a simdgroup that overwrites threadgroup memory another has not finished
      // reading, with no barrier between, shows (3: first to last, 4: last to first)
      for (int i = 0; i < n_sg; ++i) {
        int s = cfg.schedule == 3 ? i : n_sg - 1 - i;
        int lo = s * kSimdWidth, hi = std::min(n, lo + kSimdWidth);
        for (int r = 1; r > 0;) {
          for (int t = lo; t < hi; ++t) {
            Fiber* f = &w->fibers[t];
            if (f->state != F_READY) continue;
            resume(w, f);
            if (!w->error.empty()) return w->error + where(t);
          }
          r = complete(s);
          if (r < 0) return err;
        }
      }
    } else {
      if (cfg.schedule == 2) std::shuffle(order.begin(), order.end(), rng);
      for (int t : order) {
        Fiber* f = &w->fibers[t];
        if (f->state != F_READY) continue;
        resume(w, f);
        if (!w->error.empty()) return w->error + where(t);
      }
    }
    bool progress = false;
    for (int s = 0; s < n_sg; ++s) {
      int r = complete(s);
      if (r < 0) return err;
      progress = progress || r > 0;
    }
    if (progress) continue;
    int at_barrier = 0, done = 0;
    for (int t = 0; t < n; ++t) {
      at_barrier += w->fibers[t].state == F_TGBAR;
      done += w->fibers[t].state == F_DONE;
    }
    if (at_barrier == 0) break;  // every thread returned
    if (done > 0) {
      return "threadgroup_barrier reached by " + std::to_string(at_barrier) + " of " + std::to_string(n) +
             " threads of a threadgroup while " + std::to_string(done) +
             " had returned (undefined behaviour in Metal)" + where(0);
    }
    for (int t = 0; t < n; ++t) w->fibers[t].state = F_READY;
  }
  return std::string();
}

template <class F>
inline void invoke_kernel(void* fn, const ThreadAttrs& a) {
  (*static_cast<F*>(fn))(a);
}

template <class F>
inline int launch(const LaunchConfig& cfg, F& fn, char* err, int errlen) {
  auto report = [&](const std::string& m) {
    std::snprintf(err, size_t(errlen), "%s", m.c_str());
    return 1;
  };
  for (int d = 0; d < 3; ++d) {
    if (cfg.grid[d] < 1 || cfg.tg[d] < 1) return report("grid and threadgroup sizes must be >= 1");
  }
  long long tg_size = cfg.tg[0] * cfg.tg[1] * cfg.tg[2];
  if (tg_size > kMaxThreads) {
    return report("Thread group size (" + std::to_string(tg_size) +
                  ") is greater than the maximum allowed threads per threadgroup (1024).");
  }
  long long ng = 1;
  for (int d = 0; d < 3; ++d) ng *= (cfg.grid[d] + std::min(cfg.tg[d], cfg.grid[d]) - 1) / std::min(cfg.tg[d], cfg.grid[d]);
  int workers = int(std::max(1LL, std::min(cfg.workers, ng)));
  std::atomic<long long> next{0};
  std::mutex mu;
  std::string first_error;
  std::atomic<bool> failed{false};
  auto work = [&](int wid) {
    Worker w;
    Worker* saved = tl_worker;
    tl_worker = &w;
    w.invoke = &invoke_kernel<F>;
    w.fn = &fn;
    std::mt19937_64 rng(uint64_t(cfg.seed) * 1000003u + uint64_t(wid));
    for (;;) {
      long long g = next.fetch_add(1);
      if (g >= ng || failed.load()) break;
      if (cfg.schedule == 2) rng.seed(uint64_t(cfg.seed) * 1000003u + uint64_t(g));
      std::string e;
      try {
        e = run_group(&w, cfg, g, rng);
      } catch (const std::exception& ex) {
        e = ex.what();
      }
      if (!e.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.empty()) first_error = e;
        failed = true;
        break;
      }
    }
    tl_worker = saved;
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < workers; ++i) threads.emplace_back(work, i);
  work(0);
  for (auto& t : threads) t.join();
  if (!first_error.empty()) return report(first_error);
  return 0;
}

}  // namespace mtlemu

extern "C" void mtlemu_fiber_entry(mtlemu::Fiber* f) {
  mtlemu::Worker* w = f->worker;
  try {
    w->invoke(w->fn, f->attrs);
  } catch (const std::exception& e) {
    if (w->error.empty()) w->error = e.what();
  } catch (...) {
    if (w->error.empty()) w->error = "unknown exception in a kernel thread";
  }
  f->state = mtlemu::F_DONE;
  mtlemu::to_scheduler(f);
  std::abort();  // a finished fiber is never resumed
}

// ------------------------------------------------------------------------------------------
// Metal's synchronization, simdgroup and atomic functions
// ------------------------------------------------------------------------------------------
namespace metal {

enum class mem_flags : unsigned {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16
};
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(unsigned(a) | unsigned(b)); }

inline void threadgroup_barrier(mem_flags = mem_flags::mem_none) { mtlemu::threadgroup_barrier_impl(); }
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none) {
  mtlemu::exchange<char>(0, mtlemu::OP_SG_BARRIER);
}

struct simd_vote {
  uint64_t v;
  explicit operator uint64_t() const { return v; }
  bool all() const { return v == 0xffffffffull; }
  bool any() const { return v != 0; }
};

#define MTLEMU_REDUCE(fname, OP, expr)                                   \
  template <class T>                                                     \
  inline T fname(T x) {                                                  \
    auto e = mtlemu::exchange<T>(x, mtlemu::OP);                         \
    bool first = true;                                                   \
    T acc = x;                                                           \
    for (int l = 0; l < mtlemu::kSimdWidth; ++l) {                       \
      if (!e.has(l)) continue;                                           \
      T b = e.at(l);                                                     \
      if (first) {                                                       \
        acc = b;                                                         \
        first = false;                                                   \
      } else {                                                           \
        T a = acc;                                                       \
        acc = (expr);                                                    \
      }                                                                  \
    }                                                                    \
    return acc;                                                          \
  }
MTLEMU_REDUCE(simd_sum, OP_SUM, T(a + b))
MTLEMU_REDUCE(simd_product, OP_PRODUCT, T(a * b))
MTLEMU_REDUCE(simd_min, OP_MIN, min(a, b))
MTLEMU_REDUCE(simd_max, OP_MAX, max(a, b))
MTLEMU_REDUCE(simd_and, OP_AND, T(a & b))
MTLEMU_REDUCE(simd_or, OP_OR, T(a | b))
MTLEMU_REDUCE(simd_xor, OP_XOR, T(a ^ b))
#undef MTLEMU_REDUCE

#define MTLEMU_PREFIX(fname, OP, inclusive, identity, expr)              \
  template <class T>                                                     \
  inline T fname(T x) {                                                  \
    auto e = mtlemu::exchange<T>(x, mtlemu::OP);                         \
    T acc = T(identity);                                                 \
    for (int l = 0; l < e.lane + (inclusive ? 1 : 0); ++l) {             \
      if (!e.has(l)) continue;                                           \
      T a = acc, b = e.at(l);                                            \
      acc = (expr);                                                      \
    }                                                                    \
    return acc;                                                          \
  }
MTLEMU_PREFIX(simd_prefix_inclusive_sum, OP_PSUM_INC, true, 0, T(a + b))
MTLEMU_PREFIX(simd_prefix_exclusive_sum, OP_PSUM_EXC, false, 0, T(a + b))
MTLEMU_PREFIX(simd_prefix_inclusive_product, OP_PPROD_INC, true, 1, T(a * b))
MTLEMU_PREFIX(simd_prefix_exclusive_product, OP_PPROD_EXC, false, 1, T(a * b))
#undef MTLEMU_PREFIX

// A shuffle from an inactive lane returns poison (every byte 0xFF) instead of Metal's
// undefined value, so that reading one shows up.
template <class T>
inline T simd_shuffle(T x, ushort lane) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_SHUFFLE);
  return e.get_or_poison(int(lane));
}
template <class T>
inline T simd_broadcast(T x, ushort lane) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_BROADCAST);
  return e.get_or_poison(int(lane));
}
template <class T>
inline T simd_shuffle_up(T x, ushort delta) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_SHUFFLE_UP);
  int src = e.lane - int(delta);
  return src < 0 ? x : e.get_or_poison(src);
}
template <class T>
inline T simd_shuffle_down(T x, ushort delta) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_SHUFFLE_DOWN);
  int src = e.lane + int(delta);
  return src >= mtlemu::kSimdWidth ? x : e.get_or_poison(src);
}
template <class T>
inline T simd_shuffle_xor(T x, ushort mask) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_SHUFFLE_XOR);
  return e.get_or_poison(e.lane ^ int(mask));
}
template <class T>
inline T simd_shuffle_rotate_up(T x, ushort delta) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_ROTATE_UP);
  return e.get_or_poison(((e.lane - int(delta)) % 32 + 32) % 32);
}
template <class T>
inline T simd_shuffle_rotate_down(T x, ushort delta) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_ROTATE_DOWN);
  return e.get_or_poison((e.lane + int(delta)) % 32);
}
template <class T>
inline T simd_broadcast_first(T x) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_BROADCAST_FIRST);
  for (int l = 0; l < mtlemu::kSimdWidth; ++l)
    if (e.has(l)) return e.at(l);
  return x;
}
inline bool simd_all(bool x) {
  auto e = mtlemu::exchange<bool>(x, mtlemu::OP_ALL);
  for (int l = 0; l < mtlemu::kSimdWidth; ++l)
    if (e.has(l) && !e.at(l)) return false;
  return true;
}
inline bool simd_any(bool x) {
  auto e = mtlemu::exchange<bool>(x, mtlemu::OP_ANY);
  for (int l = 0; l < mtlemu::kSimdWidth; ++l)
    if (e.has(l) && e.at(l)) return true;
  return false;
}
inline simd_vote simd_ballot(bool x) {
  auto e = mtlemu::exchange<bool>(x, mtlemu::OP_BALLOT);
  uint64_t v = 0;
  for (int l = 0; l < mtlemu::kSimdWidth; ++l)
    if (e.has(l) && e.at(l)) v |= 1ull << l;
  return simd_vote{v};
}
inline simd_vote simd_active_threads_mask() {
  auto e = mtlemu::exchange<char>(0, mtlemu::OP_ACTIVE_MASK);
  return simd_vote{uint64_t(e.active)};
}
inline bool simd_is_first() {
  auto e = mtlemu::exchange<char>(0, mtlemu::OP_IS_FIRST);
  for (int l = 0; l < mtlemu::kSimdWidth; ++l)
    if (e.has(l)) return l == e.lane;
  return false;
}

#define MTLEMU_QUAD_REDUCE(fname, OP, expr)                             \
  template <class T>                                                    \
  inline T fname(T x) {                                                 \
    auto e = mtlemu::exchange<T>(x, mtlemu::OP);                        \
    int q = e.lane & ~3;                                                \
    bool first = true;                                                  \
    T acc = x;                                                          \
    for (int l = q; l < q + 4; ++l) {                                   \
      if (!e.has(l)) continue;                                          \
      T b = e.at(l);                                                    \
      if (first) {                                                      \
        acc = b;                                                        \
        first = false;                                                  \
      } else {                                                          \
        T a = acc;                                                      \
        acc = (expr);                                                   \
      }                                                                 \
    }                                                                   \
    return acc;                                                         \
  }
MTLEMU_QUAD_REDUCE(quad_sum, OP_QUAD_SUM, T(a + b))
MTLEMU_QUAD_REDUCE(quad_max, OP_QUAD_MAX, max(a, b))
MTLEMU_QUAD_REDUCE(quad_min, OP_QUAD_MIN, min(a, b))
#undef MTLEMU_QUAD_REDUCE
template <class T>
inline T quad_shuffle(T x, ushort lane) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_QUAD_SHUFFLE);
  return e.get_or_poison((e.lane & ~3) + (int(lane) & 3));
}
template <class T>
inline T quad_broadcast(T x, ushort lane) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_QUAD_BROADCAST);
  return e.get_or_poison((e.lane & ~3) + (int(lane) & 3));
}
template <class T>
inline T quad_shuffle_xor(T x, ushort mask) {
  auto e = mtlemu::exchange<T>(x, mtlemu::OP_QUAD_SHUFFLE_XOR);
  return e.get_or_poison((e.lane & ~3) + ((e.lane ^ int(mask)) & 3));
}

// Atomics: `device atomic<T>*` outputs (atomic_outputs=True) and threadgroup atomics. Threadgroups
// run in parallel on several OS threads, so these are real atomic operations.
enum memory_order { memory_order_relaxed = 0, memory_order_acquire, memory_order_release,
                    memory_order_acq_rel, memory_order_seq_cst };
template <class T>
struct atomic {
  T v_;
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<float> atomic_float;
typedef atomic<bool> atomic_bool;
typedef atomic<ulong> atomic_ulong;
typedef atomic<long> atomic_long;

template <class T>
inline std::atomic_ref<T> mtlemu_ref(volatile atomic<T>* p) {
  return std::atomic_ref<T>(const_cast<atomic<T>*>(p)->v_);
}
template <class T>
inline void atomic_store_explicit(volatile atomic<T>* p, std::type_identity_t<T> v, memory_order) {
  mtlemu_ref(p).store(v);
}
template <class T>
inline T atomic_load_explicit(volatile atomic<T>* p, memory_order) {
  return mtlemu_ref(p).load();
}
template <class T>
inline T atomic_exchange_explicit(volatile atomic<T>* p, std::type_identity_t<T> v, memory_order) {
  return mtlemu_ref(p).exchange(v);
}
template <class T>
inline bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* p, T* expected,
                                                  std::type_identity_t<T> desired, memory_order,
                                                  memory_order) {
  return mtlemu_ref(p).compare_exchange_weak(*expected, desired);
}
template <class T>
inline T atomic_fetch_add_explicit(volatile atomic<T>* p, std::type_identity_t<T> v, memory_order) {
  return mtlemu_ref(p).fetch_add(v);
}
template <class T>
inline T atomic_fetch_sub_explicit(volatile atomic<T>* p, std::type_identity_t<T> v, memory_order) {
  return mtlemu_ref(p).fetch_sub(v);
}
template <class T>
inline T atomic_fetch_and_explicit(volatile atomic<T>* p, std::type_identity_t<T> v, memory_order) {
  return mtlemu_ref(p).fetch_and(v);
}
template <class T>
inline T atomic_fetch_or_explicit(volatile atomic<T>* p, std::type_identity_t<T> v, memory_order) {
  return mtlemu_ref(p).fetch_or(v);
}
template <class T>
inline T atomic_fetch_xor_explicit(volatile atomic<T>* p, std::type_identity_t<T> v, memory_order) {
  return mtlemu_ref(p).fetch_xor(v);
}
template <class T>
inline T atomic_fetch_min_explicit(volatile atomic<T>* p, std::type_identity_t<T> v, memory_order) {
  auto r = mtlemu_ref(p);
  T old = r.load();
  while (v < old && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <class T>
inline T atomic_fetch_max_explicit(volatile atomic<T>* p, std::type_identity_t<T> v, memory_order) {
  auto r = mtlemu_ref(p);
  T old = r.load();
  while (old < v && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}

// MLX's helper for strided inputs (mlx/backend/metal/kernels/utils.h), used by its docs' examples.
template <typename IdxT = int64_t>
inline IdxT elem_to_loc(IdxT elem, const int* shape, const int64_t* strides, int ndim) {
  IdxT loc = 0;
  for (int i = ndim - 1; i >= 0 && elem > 0; --i) {
    loc += (elem % shape[i]) * IdxT(strides[i]);
    elem /= shape[i];
  }
  return loc;
}
inline int64_t elem_to_loc(uint elem, const int* shape, const int64_t* strides, int ndim) {
  return elem_to_loc<int64_t>(int64_t(elem), shape, strides, ndim);
}

constexpr float M_PI_F = 3.14159265358979323846f;
constexpr float M_PI_2_F = 1.57079632679489661923f;
constexpr float M_LOG2E_F = 1.44269504088896340736f;
constexpr float M_LN2_F = 0.693147180559945309417f;
constexpr float M_SQRT2_F = 1.41421356237309504880f;
#ifndef MAXFLOAT
#define MAXFLOAT FLT_MAX
#endif

}  // namespace metal

using namespace metal;

// Address-space qualifiers and other Metal spellings. Defined last, so that nothing above (and
// no standard header) sees them. A `threadgroup` declaration of storage in a kernel is rewritten
// into mtlemu::tg_storage by the Python side; what is left of the keyword (pointer and reference
// types) means nothing on the CPU.
#define device
#define constant
#define threadgroup
#define thread
#define ray_data
#define object_data
#define METAL_FUNC inline __attribute__((always_inline))
#define MTLEMU_EMULATOR 1
