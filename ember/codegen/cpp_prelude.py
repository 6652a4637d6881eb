"""The C++ helper functions every generated .cpp starts with (numerics that must match torch)."""

PRELUDE = r"""
#include <cstdint>

// ---- the C math library, declared here rather than through <cmath>, which took 0.25 s of each
// 0.4 s build; the rest are g++ builtins (inline instructions where the target has them)
extern "C" {
float acosf(float) noexcept; double acos(double) noexcept; float acoshf(float) noexcept; double acosh(double) noexcept;
float asinf(float) noexcept; double asin(double) noexcept; float asinhf(float) noexcept; double asinh(double) noexcept;
float atanf(float) noexcept; double atan(double) noexcept; float atanhf(float) noexcept; double atanh(double) noexcept;
float cbrtf(float) noexcept; double cbrt(double) noexcept; float cosf(float) noexcept; double cos(double) noexcept;
float coshf(float) noexcept; double cosh(double) noexcept; float erff(float) noexcept; double erf(double) noexcept;
float erfcf(float) noexcept; double erfc(double) noexcept; float expf(float) noexcept; double exp(double) noexcept;
float exp10f(float) noexcept; double exp10(double) noexcept; float exp2f(float) noexcept; double exp2(double) noexcept;
float expm1f(float) noexcept; double expm1(double) noexcept; float lgammaf(float) noexcept; double lgamma(double) noexcept;
float logf(float) noexcept; double log(double) noexcept; float log10f(float) noexcept; double log10(double) noexcept;
float log1pf(float) noexcept; double log1p(double) noexcept; float log2f(float) noexcept; double log2(double) noexcept;
float sinf(float) noexcept; double sin(double) noexcept; float sinhf(float) noexcept; double sinh(double) noexcept;
float tanf(float) noexcept; double tan(double) noexcept; float tanhf(float) noexcept; double tanh(double) noexcept;
float fmodf(float, float) noexcept; double fmod(double, double) noexcept; float atan2f(float, float) noexcept; double atan2(double, double) noexcept;
float hypotf(float, float) noexcept; double hypot(double, double) noexcept; float powf(float, float) noexcept; double pow(double, double) noexcept;
}
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
namespace ember {
static inline float sqrt(float x) { return __builtin_sqrtf(x); }
static inline double sqrt(double x) { return __builtin_sqrt(x); }
static inline float abs(float x) { return __builtin_fabsf(x); }
static inline double abs(double x) { return __builtin_fabs(x); }
static inline float floor(float x) { return __builtin_floorf(x); }
static inline double floor(double x) { return __builtin_floor(x); }
static inline float ceil(float x) { return __builtin_ceilf(x); }
static inline double ceil(double x) { return __builtin_ceil(x); }
static inline float trunc(float x) { return __builtin_truncf(x); }
static inline double trunc(double x) { return __builtin_trunc(x); }
static inline float nearbyint(float x) { return __builtin_nearbyintf(x); }
static inline double nearbyint(double x) { return __builtin_nearbyint(x); }
static inline float copysign(float x, float y) { return __builtin_copysignf(x, y); }
static inline double copysign(double x, double y) { return __builtin_copysign(x, y); }
static inline float fmod(float x, float y) { return fmodf(x, y); }
static inline double fmod(double x, double y) { return ::fmod(x, y); }
static inline float lgamma(float x) { return lgammaf(x); }
static inline double lgamma(double x) { return ::lgamma(x); }
static inline bool isinf(float x) { return __builtin_isinf(x); }
static inline bool isinf(double x) { return __builtin_isinf(x); }
static inline bool isfinite(float x) { return __builtin_isfinite(x); }
static inline bool isfinite(double x) { return __builtin_isfinite(x); }
template <typename T> static inline T max(T a, T b) { return a < b ? b : a; }
// row arrays of a symbolic length: per thread, grown to the longest row seen, never shrunk (a
// stack array of any length could overflow an OpenMP thread's stack)
template <typename T> static inline T* row_scratch(int slot, int64_t n) {
    static thread_local T* data[16] = {};
    static thread_local int64_t capacity[16] = {};
    if (capacity[slot] < n) {
        __builtin_free(data[slot]);
        data[slot] = static_cast<T*>(__builtin_malloc(static_cast<unsigned long>(n) * sizeof(T)));
        capacity[slot] = n;
    }
    return data[slot];
}
}  // namespace ember

#ifdef EMBER_USE_LIBMVEC
// glibc's libmvec has SIMD versions of these; declaring them 'simd' lets g++ vectorize loops that call them
extern "C" {
float acosf(float) noexcept __attribute__((simd("notinbranch"))); double acos(double) noexcept __attribute__((simd("notinbranch")));
float acoshf(float) noexcept __attribute__((simd("notinbranch"))); double acosh(double) noexcept __attribute__((simd("notinbranch")));
float asinf(float) noexcept __attribute__((simd("notinbranch"))); double asin(double) noexcept __attribute__((simd("notinbranch")));
float asinhf(float) noexcept __attribute__((simd("notinbranch"))); double asinh(double) noexcept __attribute__((simd("notinbranch")));
float atanf(float) noexcept __attribute__((simd("notinbranch"))); double atan(double) noexcept __attribute__((simd("notinbranch")));
float atanhf(float) noexcept __attribute__((simd("notinbranch"))); double atanh(double) noexcept __attribute__((simd("notinbranch")));
float cbrtf(float) noexcept __attribute__((simd("notinbranch"))); double cbrt(double) noexcept __attribute__((simd("notinbranch")));
float cosf(float) noexcept __attribute__((simd("notinbranch"))); double cos(double) noexcept __attribute__((simd("notinbranch")));
float coshf(float) noexcept __attribute__((simd("notinbranch"))); double cosh(double) noexcept __attribute__((simd("notinbranch")));
float erff(float) noexcept __attribute__((simd("notinbranch"))); double erf(double) noexcept __attribute__((simd("notinbranch")));
float erfcf(float) noexcept __attribute__((simd("notinbranch"))); double erfc(double) noexcept __attribute__((simd("notinbranch")));
float expf(float) noexcept __attribute__((simd("notinbranch"))); double exp(double) noexcept __attribute__((simd("notinbranch")));
float exp10f(float) noexcept __attribute__((simd("notinbranch"))); double exp10(double) noexcept __attribute__((simd("notinbranch")));
float exp2f(float) noexcept __attribute__((simd("notinbranch"))); double exp2(double) noexcept __attribute__((simd("notinbranch")));
float expm1f(float) noexcept __attribute__((simd("notinbranch"))); double expm1(double) noexcept __attribute__((simd("notinbranch")));
float logf(float) noexcept __attribute__((simd("notinbranch"))); double log(double) noexcept __attribute__((simd("notinbranch")));
float log10f(float) noexcept __attribute__((simd("notinbranch"))); double log10(double) noexcept __attribute__((simd("notinbranch")));
float log1pf(float) noexcept __attribute__((simd("notinbranch"))); double log1p(double) noexcept __attribute__((simd("notinbranch")));
float log2f(float) noexcept __attribute__((simd("notinbranch"))); double log2(double) noexcept __attribute__((simd("notinbranch")));
float sinf(float) noexcept __attribute__((simd("notinbranch"))); double sin(double) noexcept __attribute__((simd("notinbranch")));
float sinhf(float) noexcept __attribute__((simd("notinbranch"))); double sinh(double) noexcept __attribute__((simd("notinbranch")));
float tanf(float) noexcept __attribute__((simd("notinbranch"))); double tan(double) noexcept __attribute__((simd("notinbranch")));
float tanhf(float) noexcept __attribute__((simd("notinbranch"))); double tanh(double) noexcept __attribute__((simd("notinbranch")));
float atan2f(float, float) noexcept __attribute__((simd("notinbranch"))); double atan2(double, double) noexcept __attribute__((simd("notinbranch")));
float hypotf(float, float) noexcept __attribute__((simd("notinbranch"))); double hypot(double, double) noexcept __attribute__((simd("notinbranch")));
float powf(float, float) noexcept __attribute__((simd("notinbranch"))); double pow(double, double) noexcept __attribute__((simd("notinbranch")));
}
#endif

// ---- size arithmetic with Python's floor semantics (symbolic sizes: ember/symbolic.py c_code)
static inline int64_t ember_floordiv(int64_t a, int64_t b) { int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t ember_mod(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }

// ---- low-precision floats: stored as uint16_t, computed in float ----------
static inline float ember_bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16; float f; __builtin_memcpy(&f, &u, 4); return f;
}
static inline uint16_t ember_float_to_bf16(float f) {  // round to nearest even, NaN stays NaN
  uint32_t u; __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
static inline uint16_t ember_bf16_bits(float f) {  // f is a bf16 number already (NaN: a quiet one)
  uint32_t u; __builtin_memcpy(&u, &f, 4); return static_cast<uint16_t>(u >> 16);
}
static inline float ember_half_to_float(uint16_t h) { _Float16 v; __builtin_memcpy(&v, &h, 2); return static_cast<float>(v); }
static inline uint16_t ember_float_to_half(float f) {
  _Float16 v = static_cast<_Float16>(f); uint16_t h; __builtin_memcpy(&h, &v, 2); return h;
}
// the same rounding as a store and a load, kept in 32 bits: through uint16_t g++ packed and unpacked
// every vector (bf16 kernels ran 1.7x slower than their float32 forms)
static inline float ember_round_bf16(float f) {
  uint32_t u; __builtin_memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
  const uint32_t bits = (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
  float out; __builtin_memcpy(&out, &bits, 4); return out;
}
static inline float ember_round_half(float f) { return ember_half_to_float(ember_float_to_half(f)); }

// ---- bounds checks of indirect indices (check_index in lower/lower_indexing.py) ----------
// One unsigned compare per indirect load.  The rare failure records {failed, index as written, size,
// code} once in the caller's record (the kernel's ember_error argument) and reads element 0 instead;
// the host raises eager's exception after the kernel.
__attribute__((noinline, cold)) static int64_t ember_index_fail(int64_t* error, int64_t reported, int64_t size,
                                                                int64_t code) {
  if (__atomic_exchange_n(&error[0], 1, __ATOMIC_RELAXED) == 0) {
    error[1] = reported; error[2] = size; error[3] = code;
  }
  return 0;
}
static inline int64_t ember_check_index(int64_t index, int64_t size, int64_t code, int64_t reported,
                                        int64_t* error) {
  if (__builtin_expect(static_cast<uint64_t>(index) < static_cast<uint64_t>(size), 1)) return index;
  return ember_index_fail(error, reported, size, code);
}

// ---- Philox4x32-10 uniforms, bit-identical to ember/prims/philox.py (and Triton's tl.rand):
// key = seed (lo, hi words), counter = (lo, hi words of offset + i, 0, 0); the first output word -> [0, 1)
static inline float ember_philox_uniform(int64_t seed, int64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(static_cast<uint64_t>(counter) >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(static_cast<uint64_t>(seed) >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t product_b = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint64_t product_a = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint32_t next0 = static_cast<uint32_t>(product_b >> 32) ^ c1 ^ k0;
    const uint32_t next2 = static_cast<uint32_t>(product_a >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(product_b);
    c3 = static_cast<uint32_t>(product_a);
    c0 = next0;
    c2 = next2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const int32_t bits = static_cast<int32_t>(c0);
  const int64_t magnitude = bits < 0 ? -static_cast<int64_t>(bits) - 1 : bits;
  return static_cast<float>(magnitude) * 4.6566127342e-10f;
}

// ---- float exp that stays vectorized for every input -------------------------
// libmvec's expf computes a vector's lanes one at a time when any lane is outside about
// [-87.3, 88.7]: a causal softmax (exp(-inf) for half of each row) ran 5x slower, one with
// logits 200 below the row's max 12x.  This one is branch-free on every input: Cody-Waite
// reduction, Cephes' degree-6 polynomial (within 1 ulp of exp on [-87, 88]), and 2^n applied
// in two halves so that results below FLT_MIN come out as the same denormals; inf -> inf,
// -inf -> 0, NaN -> NaN (the clamps' comparisons are false for NaN, which the arithmetic keeps).
static inline float ember_expf(float x) {
  const float low = x < -104.0f ? -104.0f : x;
  const float clamped = low > 88.8f ? 88.8f : low;
  const float shifted = clamped * 1.44269504088896341f + 12582912.0f;   // 1.5 * 2^23: rounds to an integer
  int32_t n; __builtin_memcpy(&n, &shifted, 4); n -= 0x4B400000;
  const float k = shifted - 12582912.0f;
  const float r = (clamped - k * 0.693359375f) - k * -2.12194440e-4f;   // clamped - k ln 2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t half = n >> 1;
  const int32_t bits_low = (half + 127) << 23, bits_high = (n - half + 127) << 23;
  float scale_low, scale_high;
  __builtin_memcpy(&scale_low, &bits_low, 4); __builtin_memcpy(&scale_high, &bits_high, 4);
  return p * scale_low * scale_high;
}

// ---- max/min that propagate NaN like torch.maximum -------------------------
template <typename T> static inline T ember_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> static inline T ember_min(T a, T b) { return (a != a || a < b) ? a : b; }

// ---- Welford's mean and M2 (sum of squared deviations) in one pass ----------
// A row kernel (KernelPrinter.emit_welford_lanes) keeps one running (mean, M2) per vector lane
// (lane j: elements j, j + LANES, ... of the row, so all lanes have the same count), the elements
// past the last whole block in a scalar one (``tail``), and combines them after the loop with
// Chan et al.'s formula.  Each value enters shifted by the row's first one: in float, Welford's
// mean of values near 1e4 absorbs rounding errors of 1e-3 (a variance 4e-2 off for a standard
// deviation of 1e-2); shifted, the values are near 0.  A row holding inf has mean and variance
// NaN, as eager's var_mean (which is Welford's too).
template <typename T> struct ember_welford { T mean = 0; T m2 = 0; int64_t n = 0; };
template <typename T> static inline void ember_welford_add(ember_welford<T>& w, T shifted) {
  w.n += 1;
  const T delta = shifted - w.mean;
  w.mean += delta / T(w.n);
  w.m2 += delta * (shifted - w.mean);
}
template <typename T> static inline ember_welford<T> ember_welford_merge(ember_welford<T> a, ember_welford<T> b) {
  if (b.n == 0) return a;
  if (a.n == 0) return b;
  const int64_t n = a.n + b.n;
  const T delta = b.mean - a.mean, weight = T(b.n) / T(n);
  return {a.mean + delta * weight, a.m2 + b.m2 + delta * delta * T(a.n) * weight, n};
}
// lanes and tail -> (mean, M2, n) of the row, the mean unshifted
template <int LANES, typename T>
static inline ember_welford<T> ember_welford_lanes(const T* mean, const T* m2, int64_t per_lane,
                                                   ember_welford<T> tail, T shift) {
  ember_welford<T> all;
  if (per_lane > 0) {
    T spread = 0;
    for (int i = 0; i < LANES; ++i) { all.mean += mean[i]; all.m2 += m2[i]; }
    all.mean /= T(LANES);
    for (int i = 0; i < LANES; ++i) spread += (mean[i] - all.mean) * (mean[i] - all.mean);
    all.m2 += spread * T(per_lane);
    all.n = per_lane * LANES;
  }
  all = ember_welford_merge(all, tail);
  all.mean = all.n > 0 ? all.mean + shift : static_cast<T>(NAN);   // an empty row: NaN, as eager
  return all;
}

// ---- Python/torch division semantics ---------------------------------------
template <typename T> static inline T ember_floordiv_int(T a, T b) {
  if (b == 0) return 0;  // torch raises; a kernel must not crash the process
  if (b == -1) return static_cast<T>(-static_cast<uint64_t>(a));  // avoids INT_MIN / -1 trap
  T q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
template <typename T> static inline T ember_floordiv_float(T a, T b) {
  if (b == 0) return a / b;
  T mod = ember::fmod(a, b);
  T div = (a - mod) / b;
  if ((mod != 0) && ((b < 0) != (mod < 0))) div -= 1;
  T floordiv;
  if (div != 0) {
    floordiv = ember::floor(div);
    if (div - floordiv > static_cast<T>(0.5)) floordiv += 1;
  } else {
    floordiv = ember::copysign(static_cast<T>(0), a / b);
  }
  return floordiv;
}
template <typename T> static inline T ember_remainder_int(T a, T b) {
  if (b == 0 || b == -1) return 0;
  T r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
template <typename T> static inline T ember_remainder_float(T a, T b) {
  T mod = ember::fmod(a, b);
  if ((mod != 0) && ((b < 0) != (mod < 0))) mod += b;
  return mod;
}
template <typename T> static inline T ember_fmod_int(T a, T b) { return (b == 0 || b == -1) ? 0 : a % b; }
template <typename T> static inline T ember_pow_int(T base, T exp) {
  if (exp < 0) return (base == 1) ? 1 : (base == -1) ? ((exp & 1) ? -1 : 1) : 0;
  T result = 1;
  while (exp) { if (exp & 1) result *= base; exp >>= 1; base *= base; }
  return result;
}
template <typename T> static inline T ember_shl(T a, T b) {
  return (b < 0 || b >= static_cast<T>(sizeof(T) * 8)) ? 0 : static_cast<T>(static_cast<uint64_t>(a) << b);
}
template <typename T> static inline T ember_shr(T a, T b) {
  const T bits = static_cast<T>(sizeof(T) * 8);
  if (b < 0 || b >= bits) return (a < 0) ? static_cast<T>(-1) : 0;
  return a >> b;
}
template <typename T> static inline T ember_sign(T a) { return (a > 0) ? T(1) : (a < 0) ? T(-1) : a; }
static inline double ember_erfinv(double y) {  // Giles' approximation + two Newton steps on erf
  if (y <= -1) return y == -1 ? -INFINITY : NAN;
  if (y >= 1) return y == 1 ? INFINITY : NAN;
  double w = -log((1.0 - y) * (1.0 + y)), x;
  if (w < 6.25) {
    w -= 3.125;
    x = -3.6444120640178196996e-21; x = -1.685059138182016589e-19 + x * w; x = 1.2858480715256400167e-18 + x * w;
    x = 1.115787767802518096e-17 + x * w; x = -1.333171662854620906e-16 + x * w; x = 2.0972767875968561637e-17 + x * w;
    x = 6.6376381343583238325e-15 + x * w; x = -4.0545662729752068639e-14 + x * w; x = -8.1519341976054721522e-14 + x * w;
    x = 2.6335093153082322977e-12 + x * w; x = -1.2975133253453532498e-11 + x * w; x = -5.4154120542946279317e-11 + x * w;
    x = 1.051212273321532285e-09 + x * w; x = -4.1126339803469836976e-09 + x * w; x = -2.9070369957882005086e-08 + x * w;
    x = 4.2347877827932403518e-07 + x * w; x = -1.3654692000834678645e-06 + x * w; x = -1.3882523362786468719e-05 + x * w;
    x = 0.0001867342080340571352 + x * w; x = -0.00074070253416626697512 + x * w; x = -0.0060336708714301490533 + x * w;
    x = 0.24015818242558961693 + x * w; x = 1.6536545626831027356 + x * w;
  } else if (w < 16.0) {
    w = ember::sqrt(w) - 3.25;
    x = 2.2137376921775787049e-09; x = 9.0756561938885390979e-08 + x * w; x = -2.7517406297064545428e-07 + x * w;
    x = 1.8239629214389227755e-08 + x * w; x = 1.5027403968909827627e-06 + x * w; x = -4.013867526981545969e-06 + x * w;
    x = 2.9234449089955446044e-06 + x * w; x = 1.2475304481671778723e-05 + x * w; x = -4.7318229009055733981e-05 + x * w;
    x = 6.8284851459573175448e-05 + x * w; x = 2.4031110387097893999e-05 + x * w; x = -0.0003550375203628474796 + x * w;
    x = 0.00095328937973738049703 + x * w; x = -0.0016882755560235047313 + x * w; x = 0.0024914420961078508066 + x * w;
    x = -0.0037512085075692412107 + x * w; x = 0.005370914553590063617 + x * w; x = 1.0052589676941592334 + x * w;
    x = 3.0838856104922207635 + x * w;
  } else {
    w = ember::sqrt(w) - 5.0;
    x = -2.7109920616438573243e-11; x = -2.5556418169965252055e-10 + x * w; x = 1.5076572693500548083e-09 + x * w;
    x = -3.7894654401267369937e-09 + x * w; x = 7.6157012080783393804e-09 + x * w; x = -1.4960026627149240478e-08 + x * w;
    x = 2.9147953450901080826e-08 + x * w; x = -6.7711997758452339498e-08 + x * w; x = 2.2900482228026654717e-07 + x * w;
    x = -9.9298272942317002539e-07 + x * w; x = 4.5260625972231537039e-06 + x * w; x = -1.9681778105531670567e-05 + x * w;
    x = 7.5995277030017761139e-05 + x * w; x = -0.00021503011930044477347 + x * w; x = -0.00013871931833623122026 + x * w;
    x = 1.0103004648645343977 + x * w; x = 4.8499064014085844221 + x * w;
  }
  x *= y;
  for (int i = 0; i < 2; ++i) x -= (erf(x) - y) / (1.1283791670955126 * exp(-x * x));
  return x;
}
"""

# ember's own vector types and vector math (issue #13), after PRELUDE in a translation unit whose
# kernels use them (KernelPrinter.vector_loops): kept out of the others, whose builds would parse it for nothing
VECTOR_PRELUDE = r"""
// ---- ember's vector types: float lanes in registers, explicit, not left to the auto-vectorizer -------
// VEC_WIDTH float lanes: 16 with AVX-512F, 8 with AVX2 + FMA, else 1 (a plain float; the same code).
// g++'s vector extensions, not <immintrin.h> (a larger header to parse for every build): arithmetic,
// comparisons (lanes of -1 / 0) and ?: on them compile to the target's instructions.  bf16/fp16 are
// loaded into float lanes and rounded to nearest even on store, NaN kept quiet, as the scalar forms.
// The math functions are branch-free (every lane takes the same path), their max errors measured
// against float64 in tests/codegen/test_cpu_vec.py (AVX2): exp 0.98, log 0.75, erf 1.03, tanh 1.21,
// sigmoid 2.32 ulp (the bounds tested: 1, 1, 1.5, 1.5, 2.5).
namespace ember {
#if defined(__AVX512F__)
constexpr int VEC_WIDTH = 16;
#define VEC_WIDTH_IS_16 1
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int VEC_WIDTH = 8;
#define VEC_WIDTH_IS_8 1
#else
constexpr int VEC_WIDTH = 1;
#endif
typedef float Vec __attribute__((vector_size(4 * VEC_WIDTH)));
typedef int32_t VecInt __attribute__((vector_size(4 * VEC_WIDTH)));     // a comparison's lanes: -1 or 0
typedef uint32_t VecBits __attribute__((vector_size(4 * VEC_WIDTH)));
typedef uint16_t VecHalfBits __attribute__((vector_size(2 * VEC_WIDTH)));

static inline Vec vec_splat(float x) { return Vec{} + x; }
static inline Vec vec_as_float(VecBits u) { return (Vec)u; }     // a cast between vector types keeps the bits
static inline VecBits vec_bits(Vec v) { return (VecBits)v; }
static inline Vec vec_select(VecInt mask, Vec a, Vec b) { return mask ? a : b; }
// loads and stores; the _tail forms touch lanes [0, n) only (the rest read as 0)
static inline Vec vec_load(const float* p) { Vec v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void vec_store(float* p, Vec v) { __builtin_memcpy(p, &v, sizeof v); }
static inline Vec vec_from_bf16(VecHalfBits h) { return vec_as_float(__builtin_convertvector(h, VecBits) << 16); }
static inline Vec vec_round_bf16(Vec v) {    // to the nearest bf16, kept in float lanes (ember_round_bf16)
  const VecBits u = vec_bits(v);
  const VecBits rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const VecBits quiet_nan = (u | 0x00400000u) & 0xffff0000u;
  return vec_as_float((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
static inline VecHalfBits vec_bf16_bits(Vec rounded) { return __builtin_convertvector(vec_bits(rounded) >> 16, VecHalfBits); }
static inline Vec vec_load_bf16(const uint16_t* p) { VecHalfBits h; __builtin_memcpy(&h, p, sizeof h); return vec_from_bf16(h); }
static inline void vec_store_bf16(uint16_t* p, Vec v) { const VecHalfBits h = vec_bf16_bits(vec_round_bf16(v)); __builtin_memcpy(p, &h, sizeof h); }
// fp16: F16C's conversions for 8 lanes (g++ 12 converts a _Float16 vector one lane at a time), else
// the scalar ones lane by lane
#if VEC_WIDTH_IS_8 && defined(__F16C__)
typedef short VecShort8 __attribute__((vector_size(16)));
static inline Vec vec_from_half(VecHalfBits h) { return __builtin_ia32_vcvtph2ps256((VecShort8)h); }
static inline VecHalfBits vec_half_bits(Vec v) { return (VecHalfBits)__builtin_ia32_vcvtps2ph256(v, 0); }   // 0: nearest even
#else
static inline Vec vec_from_half(VecHalfBits h) { Vec v; for (int i = 0; i < VEC_WIDTH; ++i) v[i] = ember_half_to_float(h[i]); return v; }
static inline VecHalfBits vec_half_bits(Vec v) { VecHalfBits h; for (int i = 0; i < VEC_WIDTH; ++i) h[i] = ember_float_to_half(v[i]); return h; }
#endif
static inline Vec vec_load_half(const uint16_t* p) { VecHalfBits h; __builtin_memcpy(&h, p, sizeof h); return vec_from_half(h); }
static inline void vec_store_half(uint16_t* p, Vec v) { const VecHalfBits h = vec_half_bits(v); __builtin_memcpy(p, &h, sizeof h); }
static inline Vec vec_round_half(Vec v) { return vec_from_half(vec_half_bits(v)); }
template <typename T> static inline Vec vec_load_tail_as(const T* p, int64_t n, Vec (*load)(const T*)) {
  T lanes[VEC_WIDTH] = {};
  for (int64_t i = 0; i < n; ++i) lanes[i] = p[i];
  return load(lanes);
}
static inline Vec vec_load_tail(const float* p, int64_t n) { return vec_load_tail_as<float>(p, n, vec_load); }
static inline Vec vec_load_bf16_tail(const uint16_t* p, int64_t n) { return vec_load_tail_as<uint16_t>(p, n, vec_load_bf16); }
static inline Vec vec_load_half_tail(const uint16_t* p, int64_t n) { return vec_load_tail_as<uint16_t>(p, n, vec_load_half); }
template <typename T> static inline void vec_store_tail_as(T* p, Vec v, int64_t n, void (*store)(T*, Vec)) {
  T lanes[VEC_WIDTH];
  store(lanes, v);
  for (int64_t i = 0; i < n; ++i) p[i] = lanes[i];
}
static inline void vec_store_tail(float* p, Vec v, int64_t n) { vec_store_tail_as<float>(p, v, n, vec_store); }
static inline void vec_store_bf16_tail(uint16_t* p, Vec v, int64_t n) { vec_store_tail_as<uint16_t>(p, v, n, vec_store_bf16); }
static inline void vec_store_half_tail(uint16_t* p, Vec v, int64_t n) { vec_store_tail_as<uint16_t>(p, v, n, vec_store_half); }
// lanes [0, n) of a tail: all -1 (true), the rest 0
static inline VecInt vec_tail_mask(int64_t n) {
  VecInt lane; for (int i = 0; i < VEC_WIDTH; ++i) lane[i] = i;
  return lane < static_cast<int32_t>(n);
}
// arithmetic beyond the operators (which take a float on either side too)
static inline Vec vec_fma(Vec a, Vec b, Vec c) { return a * b + c; }    // one vfmadd (-ffp-contract=fast, g++'s default)
static inline Vec vec_abs(Vec v) { return vec_as_float(vec_bits(v) & 0x7fffffffu); }
static inline Vec vec_sqrt(Vec v) { for (int i = 0; i < VEC_WIDTH; ++i) v[i] = __builtin_sqrtf(v[i]); return v; }
// maximum / minimum that propagate NaN (torch.maximum): a NaN in either lane is the result
static inline Vec vec_max(Vec a, Vec b) { return (a != a) | (a > b) ? a : b; }
static inline Vec vec_min(Vec a, Vec b) { return (a != a) | (a < b) ? a : b; }
static inline bool vec_all(VecInt mask) {   // every lane true (-1)
  int32_t all = -1; for (int i = 0; i < VEC_WIDTH; ++i) all &= mask[i]; return all != 0;
}
// horizontal: lanes in order, one at a time (once a row, after its loop)
static inline float vec_sum(Vec v) { float s = v[0]; for (int i = 1; i < VEC_WIDTH; ++i) s += v[i]; return s; }
static inline float vec_reduce_max(Vec v) { float m = v[0]; for (int i = 1; i < VEC_WIDTH; ++i) m = (m != m || m > v[i]) ? m : v[i]; return m; }
static inline float vec_reduce_min(Vec v) { float m = v[0]; for (int i = 1; i < VEC_WIDTH; ++i) m = (m != m || m < v[i]) ? m : v[i]; return m; }

// exp: ember_expf's algorithm in lanes (Cody-Waite reduction, Cephes' degree-6 polynomial, 2^n in
// two halves so that denormal results are exact); inf -> inf, -inf -> 0, NaN -> NaN
static inline Vec vec_exp(Vec x) {
  const Vec low = x < -104.0f ? vec_splat(-104.0f) : x;
  const Vec clamped = low > 88.8f ? vec_splat(88.8f) : low;
  const Vec shifted = clamped * 1.44269504088896341f + 12582912.0f;
  const VecInt n = (VecInt)shifted - 0x4B400000;
  const Vec k = shifted - 12582912.0f;
  const Vec r = (clamped - k * 0.693359375f) - k * -2.12194440e-4f;
  Vec p = vec_splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const VecInt half = n >> 1;
  const VecInt bits_low = (half + 127) << 23, bits_high = (n - half + 127) << 23;
  return p * (Vec)bits_low * (Vec)bits_high;
}
// log: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by Cephes' degree-8 polynomial;
// denormals scaled up first; 0 -> -inf, inf -> inf, x < 0 and NaN -> NaN
static inline Vec vec_log(Vec x) {
  const VecInt tiny = x < 1.17549435e-38f;
  const Vec scaled = tiny ? x * 8388608.0f : x;                       // 2^23
  const VecBits u = vec_bits(scaled);
  Vec e = __builtin_convertvector((VecInt)u >> 23, Vec) - 126.0f - (tiny ? vec_splat(23.0f) : Vec{});
  Vec m = vec_as_float((u & 0x007fffffu) | 0x3f000000u);             // [0.5, 1)
  const VecInt small = m < 0.707106781186547524f;
  e = small ? e - 1.0f : e;
  m = (small ? m + m : m) - 1.0f;
  const Vec z = m * m;
  Vec p = vec_splat(7.0376836292e-2f);
  p = p * m - 1.1514610310e-1f;
  p = p * m + 1.1676998740e-1f;
  p = p * m - 1.2420140846e-1f;
  p = p * m + 1.4249322787e-1f;
  p = p * m - 1.6668057665e-1f;
  p = p * m + 2.0000714765e-1f;
  p = p * m - 2.4999993993e-1f;
  p = p * m + 3.3333331174e-1f;
  Vec y = p * m * z + e * -2.12194440e-4f - 0.5f * z;
  y = m + y + e * 0.693359375f;
  y = x == __builtin_inff() ? x : y;
  y = x == 0.0f ? vec_splat(-__builtin_inff()) : y;
  return (x < 0.0f) | (x != x) ? vec_splat(__builtin_nanf("")) : y;
}
// tanh: x + x^3 P(x^2) below 0.625 (Cephes), else 1 - 2 / (exp(2|x|) + 1) with x's sign
static inline Vec vec_tanh(Vec x) {
  const Vec a = vec_abs(x);
  const Vec z = x * x;
  Vec p = vec_splat(-5.70498872745e-3f);
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const Vec near_zero = p * z * a + a;      // of |x|, then x's sign: tanh(-0) is -0
  const Vec far = 1.0f - 2.0f / (vec_exp(a + a) + 1.0f);
  return vec_as_float(vec_bits(a < 0.625f ? near_zero : far) | (vec_bits(x) & 0x80000000u));
}
// sigmoid: 1 / (1 + exp(-x)), eager's formula (0 below about -88.7, where exp(-x) overflows)
static inline Vec vec_sigmoid(Vec x) { return 1.0f / (1.0f + vec_exp(-x)); }
// erf: x P(x^2) below 0.921875; above, 1 - exp(-x^2) Q(1/|x|) with x's sign (Q: erfc(x) exp(x^2)),
// 1 from 3.92 on (erfc is below half an ulp of 1 there).  Both fitted for ember (minimax-weighted
// least squares on float32 coefficients: relative errors 5.8e-8 and 6.1e-8)
static inline Vec vec_erf(Vec x) {
  const Vec a = vec_abs(x);
  const Vec z = x * x;
  Vec p = vec_splat(8.370426075998694e-05f);
  p = p * z - 0.000814279483165592f;
  p = p * z + 0.005201042164117098f;
  p = p * z - 0.026859402656555176f;
  p = p * z + 0.11283695697784424f;
  p = p * z - 0.37612634897232056f;
  p = p * z + 0.1283791670955126f;                                   // 2 / sqrt(pi) - 1: x + x p, more exact than x (1 + p)
  const Vec near_zero = x + x * p;
  const VecInt near = a < 0.921875f;
  if (vec_all(near)) return near_zero;                                // (GELU's usual case: half the work)
  const Vec c = a < 3.92f ? a : vec_splat(3.92f);
  const Vec t = 1.0f / c;
  Vec q = vec_splat(0.019293995574116707f);
  q = q * t - 0.11678037792444229f;
  q = q * t + 0.2877334952354431f;
  q = q * t - 0.3322053849697113f;
  q = q * t + 0.0639655590057373f;
  q = q * t + 0.32669395208358765f;
  q = q * t - 0.4103187918663025f;
  q = q * t + 0.028232673183083534f;
  q = q * t + 0.5607942342758179f;
  q = q * t + 0.00017424047109670937f;
  const Vec square = c * c;
  const Vec square_low = c * c - square;                              // exact with an fma
  const Vec far = 1.0f - vec_exp(-square) * (1.0f - square_low) * q;
  const Vec signed_far = vec_as_float(vec_bits(far) | (vec_bits(x) & 0x80000000u));
  return near | (x != x) ? near_zero : signed_far;
}
// The kernels' exp (except where it may be far below zero: cpp.INLINE_EXPF), log, erf and tanh:
// glibc's libmvec where the build has it, ember's own otherwise.  libmvec's were faster on the
// Zen 1 dev host (ns/element, 8 lanes: erf 1.9 vs 4.5, exp 1.5 vs 2.3, log 1.7 vs 3.0, tanh 2.6 vs
// 3.4) and are as accurate (tests/codegen/test_cpu_vector_math.py); the scalar loops use them too.
#if defined(EMBER_USE_LIBMVEC) && (VEC_WIDTH_IS_8 || VEC_WIDTH_IS_16)
#if VEC_WIDTH_IS_8
#define EMBER_LIBMVEC(name) _ZGVdN8v_##name
#else
#define EMBER_LIBMVEC(name) _ZGVeN16v_##name
#endif
extern "C" Vec EMBER_LIBMVEC(expf)(Vec) noexcept;
extern "C" Vec EMBER_LIBMVEC(logf)(Vec) noexcept;
extern "C" Vec EMBER_LIBMVEC(erff)(Vec) noexcept;
extern "C" Vec EMBER_LIBMVEC(tanhf)(Vec) noexcept;
static inline Vec vec_libm_exp(Vec x) { return EMBER_LIBMVEC(expf)(x); }
static inline Vec vec_libm_log(Vec x) { return EMBER_LIBMVEC(logf)(x); }
static inline Vec vec_libm_erf(Vec x) { return EMBER_LIBMVEC(erff)(x); }
static inline Vec vec_libm_tanh(Vec x) { return EMBER_LIBMVEC(tanhf)(x); }
#else
static inline Vec vec_libm_exp(Vec x) { return vec_exp(x); }
static inline Vec vec_libm_log(Vec x) { return vec_log(x); }
static inline Vec vec_libm_erf(Vec x) { return vec_erf(x); }
static inline Vec vec_libm_tanh(Vec x) { return vec_tanh(x); }
#endif
static inline Vec vec_libm_sigmoid(Vec x) { return 1.0f / (1.0f + vec_libm_exp(-x)); }
}  // namespace ember
"""

LIBMVEC_FUNCTIONS = frozenset(['acos', 'acosh', 'asin', 'asinh', 'atan', 'atanh', 'cbrt', 'cos', 'cosh', 'erf', 'erfc', 'exp', 'exp10', 'exp2', 'expm1', 'log', 'log10', 'log1p', 'log2', 'sin', 'sinh', 'tan', 'tanh', 'atan2', 'hypot', 'pow'])
