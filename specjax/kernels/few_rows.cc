// Two XLA FFI custom calls for the CPU, for calls on a few tokens (decoding steps and verify
// calls); specjax/kernels builds and registers them, specjax/model/linear.py picks
// them by call width:
//
//   specjax_few_rows             y[T, O] = x[T, I] . w[O, I]^T (float32), below;
//   specjax_few_query_attention  attention to a layer's KV cache, read in place (at the end);
//   ..._bf16                     the same two with w, or the cache, in bfloat16;
//   specjax_few_rows_q8          the product with w in 8 bits: int8 values, a float16 scale
//                                per block of consecutive inputs (GGUF's Q8_0 for blocks of 32);
//   specjax_few_rows_q8_0        the q8_0 dtype's product: those weights times activations
//                                rounded to 8 bits too, integer sums (llama.cpp's Q8_0 x Q8_0);
//   specjax_rope(_tables)        RoPE for calls of a few tokens (at the end).
//
// bfloat16 operands are widened to float32 as they are loaded (a bfloat16 is the top half of a
// float32, so the widening is exact) and every sum is a float32 sum in the same order as the
// float32 kernel's: a bfloat16 model reads half the bytes a step, and its products get the
// float32 kernel's bits on the widened weights. 8-bit weights are dequantised as they are
// loaded, value times its block's scale in float32, which is exact too (an int8 times a
// float16 needs 8 + 11 bits of the 24 a float32 has): the float32 kernel's bits on the
// dequantised weights, at a quarter of the bytes. x, q and the outputs stay float32 (they are
// small; the caller casts them).
//
// The product. Why: with 2 to 32 rows, XLA's and OpenBLAS's matrix products on a CPU cost 2 to
// 3 times a one-row product (a mat-vec) over the same weights, although the rows add little
// arithmetic: the weights are what costs, and their bytes are the same. This kernel reads each
// weight once from memory, whatever T is:
//
//   - w is walked in blocks of R consecutive rows (R x I floats, a few KiB, stays in L1);
//   - each block is multiplied with every row of x (a few KiB more, in L1), TB rows at a time,
//     with R x TB vector accumulators held in registers: one vector load of w serves TB
//     products, one load of x serves R;
//   - a software prefetch keeps the next bytes of w in flight while the block computes;
//   - the rows of w are split into one contiguous part per core, streamed by the calling thread
//     and XLA's intra-op threads (see parallel_for), so every core streams.
//
// Each output is sum over I of w[o, i] * x[t, i], accumulated lane-wise in chunks of VW, then
// the lanes summed in a fixed order, then the tail (I mod VW) added: the same operations for
// every (o, t), whatever T, the block sizes or the thread that computes it. So a row of x gets
// the same bits in a call of 2 rows as in a call of 30.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <memory>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// Vector width VW (floats), rows of w per block R, rows of x per block TB: R * TB accumulators,
// R vectors of w and one of x must fit the register file (32 vectors with AVX-512, 16 else).
// Chosen on SmolLM2's shapes (2-core Zen 5, AVX-512), calls of 5 / 9 / 17 rows over a one-row
// XLA step: R = 4, TB = 5 1.29 / 1.42 / 2.28; R = 3, TB = 8 1.34 / 1.48 / 2.51; R = 2, TB = 12
// 1.41 / 1.58 / 2.40; R = 6, TB = 4 1.25 / 1.62 / 2.21 (prefetching 512 floats ahead).
#if defined(__AVX512F__)
constexpr int VW = 16, R = 4, TB = 5;
#elif defined(__AVX__)
constexpr int VW = 8, R = 2, TB = 5;
#else
constexpr int VW = 4, R = 2, TB = 5;
#endif
// How far ahead of the block's reads w is prefetched, in floats of each row: 16 KiB, several
// blocks ahead, so that the memory system has requests in flight while a block computes. On
// the same machine, 17-row calls cost 2.37 steps prefetching 512 floats ahead, 2.30 at 1,024,
// 1.72-1.93 at 2,048-4,096 and 1.82 at 8,192-16,384.
// For bfloat16 weights the same distance in bytes: 8,192 elements.
constexpr int64_t kPrefetchBytes = 4096 * sizeof(float);

typedef float Vec __attribute__((vector_size(VW * sizeof(float))));
typedef uint32_t UVec __attribute__((vector_size(VW * sizeof(uint32_t))));
typedef uint16_t HVec __attribute__((vector_size(VW * sizeof(uint16_t))));

// A bfloat16 as its bits; XLA's BF16 buffers hold exactly these.
using bf16 = uint16_t;

template <typename W>
constexpr int64_t kPrefetch = kPrefetchBytes / sizeof(W);

static inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}

// VW bfloat16s widened to float32: each one's bits become the top half of a float's. One
// zero-extending load and a shift, written with intrinsics: from the generic form, GCC tuned
// for AMD's AVX-512 CPUs split the widening into halves, five instructions a vector (SmolLM2's
// 211 products of one row, in sequence, on the 2-core Zen 4 host: 14.1 ms that way, 13.0 ms
// this way, 19.0 ms in float32).
static inline Vec load(const bf16* p) {
#if defined(__AVX512F__)
  const __m512i u = _mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
  return reinterpret_cast<Vec>(_mm512_castsi512_ps(u));
#elif defined(__AVX2__)
  const __m256i u = _mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
  return reinterpret_cast<Vec>(_mm256_castsi256_ps(u));
#else
  HVec h;
  std::memcpy(&h, p, sizeof h);
  const UVec u = __builtin_convertvector(h, UVec) << 16;
  Vec v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

static inline float to_float(float x) { return x; }

static inline float to_float(bf16 x) {
  const uint32_t u = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// An empty asm that claims to change v: the compiler must hold v in a vector register here.
static inline void keep_in_register(Vec& v) {
#if defined(__AVX512F__)
  asm volatile("" : "+v"(v));
#elif defined(__x86_64__)
  asm volatile("" : "+x"(v));
#else
  (void)v;
#endif
}

// acc + a * b, fused, always. Written as `acc += a * b` the compiler fuses it in most of the
// templates' instances, but GCC built for AVX2 left it unfused in a few (one row of w, one row
// of x), so a row's bits depended on the call's width there, and a bfloat16 product differed
// from the float32 one on the widened weights (caught by building the kernels with
// -mno-avx512f on the AVX-512 host).
static inline Vec fma(Vec a, Vec b, Vec acc) {
#if defined(__AVX512F__)
  return reinterpret_cast<Vec>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a),
                                               reinterpret_cast<__m512>(b),
                                               reinterpret_cast<__m512>(acc)));
#elif defined(__FMA__)
  return reinterpret_cast<Vec>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a),
                                               reinterpret_cast<__m256>(b),
                                               reinterpret_cast<__m256>(acc)));
#else
  return acc + a * b;
#endif
}

static inline float sum_lanes(Vec v) {
  float lane[VW];
  std::memcpy(lane, &v, sizeof v);
  float s = 0.0f;
  for (int j = 0; j < VW; ++j) s += lane[j];
  return s;
}

// y[t, r] for the `rows` rows of w at `w` and the `cols` rows of x at `x` (rows <= R,
// cols <= TB; templated so the accumulators are registers). n_in is I, n_out is y's row stride.
template <int rows, int cols, typename W>
static void block(const float* x, const W* w, float* y, int64_t n_in, int64_t n_out) {
  Vec acc[rows][cols];
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < cols; ++t) acc[r][t] = Vec{};
  int64_t i = 0;
  for (; i + VW <= n_in; i += VW) {
    Vec wv[rows];
    for (int r = 0; r < rows; ++r) {
      wv[r] = load(w + r * n_in + i);
      __builtin_prefetch(w + r * n_in + i + kPrefetch<W>);
    }
    for (int t = 0; t < cols; ++t) {
      Vec xv = load(x + t * n_in + i);
      // Keep xv in a register: left alone, the compiler folds the load into every product
      // below, which makes the loop load-bound (measured: 1.8x slower for 5 rows in cache).
      keep_in_register(xv);
      for (int r = 0; r < rows; ++r) acc[r][t] = fma(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < cols; ++t) {
      float s = sum_lanes(acc[r][t]);
      // Fused explicitly: left to itself the compiler fuses this sum for one type of w and
      // not for another, and the bfloat16 kernel would not give the float32 kernel's bits.
      for (int64_t j = i; j < n_in; ++j)
        s = std::fma(to_float(w[r * n_in + j]), x[t * n_in + j], s);
      y[t * n_out + r] = s;
    }
}

// 8-bit weights: int8 values [O, I] row-major and a float16 scale per `block` consecutive
// values of a row [O, I / block], the block a multiple of VW (GGUF's Q8_0: blocks of 32).
struct Q8Rows {
  const int8_t* q;
  const uint16_t* d;     // float16 bits
  int64_t block;
  friend Q8Rows operator+(Q8Rows w, int64_t values) {
    return {w.q + values, w.d + values / w.block, w.block};
  }
};

// A float16 (its bits) as a float32, exactly.
static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = uint32_t{h & 0x8000u} << 16, exponent = (h >> 10) & 0x1f,
                 mantissa = h & 0x3ffu;
  if (exponent == 0) {                                  // zero or subnormal: mantissa * 2^-24
    const float f = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -f : f;
  }
  const uint32_t bits = sign | (exponent == 31 ? 0x7f800000u | mantissa << 13
                                               : (exponent + 112) << 23 | mantissa << 13);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// VW int8 values as float32, times their block's scale: the dequantised weights, exactly.
static inline Vec load(const int8_t* p, Vec scale) {
#if defined(__AVX512F__)
  const __m512 v = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  return reinterpret_cast<Vec>(v) * scale;
#elif defined(__AVX2__)
  const __m256 v = _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  return reinterpret_cast<Vec>(v) * scale;
#else
  typedef int8_t BVec __attribute__((vector_size(VW)));
  BVec b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, Vec) * scale;
#endif
}

// block() for 8-bit weights: the same sums over the dequantised values, block by block of the
// scales (the blocks are whole vectors, so there is no tail).
template <int rows, int cols>
static void block(const float* x, Q8Rows w, float* y, int64_t n_in, int64_t n_out) {
  Vec acc[rows][cols];
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < cols; ++t) acc[r][t] = Vec{};
  const int64_t blocks = n_in / w.block;
  for (int64_t b = 0; b < blocks; ++b) {
    Vec scale[rows];
    for (int r = 0; r < rows; ++r) scale[r] = Vec{} + half_to_float(w.d[r * blocks + b]);
    for (int64_t i = b * w.block; i < (b + 1) * w.block; i += VW) {
      Vec wv[rows];
      for (int r = 0; r < rows; ++r) {
        wv[r] = load(w.q + r * n_in + i, scale[r]);
        __builtin_prefetch(w.q + r * n_in + i + kPrefetch<int8_t>);
      }
      for (int t = 0; t < cols; ++t) {
        Vec xv = load(x + t * n_in + i);
        keep_in_register(xv);
        for (int r = 0; r < rows; ++r) acc[r][t] = fma(wv[r], xv, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < cols; ++t) y[t * n_out + r] = sum_lanes(acc[r][t]);
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// bfloat16 weights times bfloat16 activations, in pairs: VDPBF16PS multiplies 16 pairs of
// bfloat16s (inputs 2l and 2l + 1 of a chunk of 32, in lane l) and adds both products to the
// lane's float32 sum, with no widening and twice the products of an fma an instruction. Its
// arithmetic is the instruction's own (each bfloat16 product is exact in float32; the two adds
// round to nearest even; denormal inputs read as zero and denormal sums flush to zero), then
// the lanes are summed in the fixed order and the tail (I mod 32) added by fmas on the
// widened values, as `block` does: the same operations for every (o, t) whatever T, so a row's
// bits do not depend on the call's width.
constexpr bool kBf16Pairs = true;

template <int rows, int cols>
static void block(const bf16* x, const bf16* w, float* y, int64_t n_in, int64_t n_out) {
  __m512 acc[rows][cols];
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < cols; ++t) acc[r][t] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n_in; i += 32) {
    __m512bh wv[rows];
    for (int r = 0; r < rows; ++r) {
      wv[r] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + r * n_in + i));
      __builtin_prefetch(w + r * n_in + i + kPrefetch<bf16>);
    }
    for (int t = 0; t < cols; ++t) {
      __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + t * n_in + i));
      asm volatile("" : "+v"(xv));       // held in a register (`keep_in_register`)
      for (int r = 0; r < rows; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < cols; ++t) {
      float s = sum_lanes(reinterpret_cast<Vec>(acc[r][t]));
      for (int64_t j = i; j < n_in; ++j)
        s = std::fma(to_float(w[r * n_in + j]), to_float(x[t * n_in + j]), s);
      y[t * n_out + r] = s;
    }
}
#else
constexpr bool kBf16Pairs = false;
#endif

// The last `left` rows of x (fewer than TB) against `rows` rows of w: block<rows, left>. Here and
// below W is how the rows of w are reached: a pointer to float32 or bfloat16 values, or Q8Rows;
// `w + k` is w from its k-th value on (k a whole number of rows). X is x's type: float32, or
// bfloat16 for the bfloat16-pair products (`block` on two bfloat16 operands, below).
template <int rows, int cols = TB - 1, typename X, typename W>
static void block_rest(int64_t left, const X* x, W w, float* y, int64_t n_in,
                       int64_t n_out) {
  if constexpr (cols > 0) {
    if (left == cols) return block<rows, cols>(x, w, y, n_in, n_out);
    block_rest<rows, cols - 1>(left, x, w, y, n_in, n_out);
  }
}

// Every row of x (T of them) against `rows` rows of w, TB rows of x at a time.
template <int rows, typename X, typename W>
static void block_all_x(const X* x, W w, float* y, int64_t T, int64_t n_in,
                        int64_t n_out) {
  int64_t t = 0;
  for (; t + TB <= T; t += TB) block<rows, TB>(x + t * n_in, w, y + t * n_out, n_in, n_out);
  block_rest<rows>(T - t, x + t * n_in, w, y + t * n_out, n_in, n_out);
}

// Outputs [o0, o1) of every row.
template <typename X, typename W>
static void span(const X* x, W w, float* y, int64_t T, int64_t n_in,
                 int64_t n_out, int64_t o0, int64_t o1) {
  int64_t o = o0;
  for (; o + R <= o1; o += R) block_all_x<R>(x, w + o * n_in, y + o, T, n_in, n_out);
  for (; o < o1; ++o) block_all_x<1>(x, w + o * n_in, y + o, T, n_in, n_out);
}

// Below this many bytes of operands a call runs on the calling thread alone: waking a helper
// costs microseconds, more than a small model's product or a short cache's attention takes.
constexpr int64_t kParallelBytes = 256 << 10;

// Runs fn(item) for items 0 .. n-1 on the calling thread and XLA's intra-op threads. The
// items are split into one contiguous part per thread: thread p takes the items of part p in
// order (for the products, one contiguous stretch of w, which the hardware and software
// prefetches run ahead along), then helps with the other parts' remaining items. A helper that
// starts late just finds less to do; the caller alone would do everything. The state is held by
// shared_ptr: a helper that starts after the call has returned finds nothing left and lets go.
template <typename Fn>
static void parallel_for(ffi::ThreadPool& pool, int64_t n, int64_t bytes, Fn fn) {
  struct Shared {
    Shared(Fn fn, int64_t n, int64_t parts)
        : fn(fn), n(n), parts(parts), next(new std::atomic<int64_t>[parts]) {
      for (int64_t p = 0; p < parts; ++p) next[p] = n * p / parts;
    }
    Fn fn;
    int64_t n, parts;
    std::unique_ptr<std::atomic<int64_t>[]> next;   // per part: its next item
    std::atomic<int64_t> done{0};
    int64_t part_end(int64_t p) const { return n * (p + 1) / parts; }
    void run(int64_t first_part) {
      for (int64_t k = 0; k < parts; ++k) {
        const int64_t p = (first_part + k) % parts;
        for (int64_t i; (i = next[p].fetch_add(1, std::memory_order_relaxed)) < part_end(p);) {
          fn(i);
          done.fetch_add(1, std::memory_order_release);
        }
      }
    }
  };
  // The caller works too, so one helper fewer than XLA's pool has threads (one per core).
  const int64_t threads = bytes < kParallelBytes ? 1 : std::max<int64_t>(1, pool.num_threads());
  const int64_t parts = std::min<int64_t>(threads, n);
  if (parts <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto shared = std::make_shared<Shared>(fn, n, parts);
  for (int64_t p = 1; p < parts; ++p) pool.Schedule([shared, p] { shared->run(p); });
  shared->run(0);
  while (shared->done.load(std::memory_order_acquire) < n) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

// XLA's element type of a weight or cache type.
template <typename W>
constexpr ffi::DataType kType = std::is_same_v<W, float> ? ffi::F32 : ffi::BF16;

// Every weight and cache operand may hold all the model's layers at once, stacked along a
// leading axis L of `rank` + 1 dimensions, with `layer` [] int32 saying which one a call reads,
// where it lies: the decoder compiles one layer's body for all layers (a loop over L), and a
// slice of the stacked array would be a copy of the layer on every call. An operand of `rank`
// dimensions is one layer (L = 1, layer 0). Sets `first` to the index of the layer's first
// element and `dims` to its own dimensions (without L); false if `layer` is outside [0, L).
static bool layer_of(ffi::Span<const int64_t> all, int64_t rank, ffi::Buffer<ffi::S32> layer,
                     int64_t* first, int64_t* dims) {
  if (static_cast<int64_t>(all.size()) != rank && static_cast<int64_t>(all.size()) != rank + 1)
    return false;
  const int64_t lead = static_cast<int64_t>(all.size()) - rank;
  const int64_t layers = lead ? all[0] : 1, index = layer.typed_data()[0];
  if (index < 0 || index >= layers) return false;
  int64_t size = 1;
  for (int64_t i = 0; i < rank; ++i) size *= (dims[i] = all[lead + i]);
  *first = index * size;
  return true;
}

template <typename W>
static ffi::Error FewRows(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                          ffi::Buffer<kType<W>> w, ffi::Buffer<ffi::S32> layer,
                          ffi::ResultBuffer<ffi::F32> y) {
  int64_t first, w_dims[2];
  if (!layer_of(w.dimensions(), 2, layer, &first, w_dims))
    return ffi::Error::InvalidArgument("w must be [O, I] or [L, O, I] with layer in [0, L)");
  const int64_t n_out = w_dims[0], n_in = w_dims[1];
  if (n_in == 0 || x.element_count() % n_in != 0)
    return ffi::Error::InvalidArgument("x's last axis must be w's I");
  const float* xd = x.typed_data();
  const W* wd = static_cast<const W*>(w.untyped_data()) + first;
  float* yd = y->typed_data();
  const int64_t T = x.element_count() / n_in;
  // Chunks of a multiple of R rows of w, 8 a thread: small enough that the threads finish
  // together.
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t chunk = std::max<int64_t>(4 * R, (n_out / (8 * threads) + R - 1) / R * R);
  parallel_for(pool, (n_out + chunk - 1) / chunk, n_out * n_in * int64_t{sizeof(W)},
               [=](int64_t c) {
    span(xd, wd, yd, T, n_in, n_out, c * chunk, std::min(n_out, (c + 1) * chunk));
  });
  return ffi::Error::Success();
}

#define SPECJAX_FEW_ROWS(name, W)                                                   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, FewRows<W>,                                   \
                                ffi::Ffi::Bind()                                    \
                                    .Ctx<ffi::ThreadPool>()                         \
                                    .Arg<ffi::Buffer<ffi::F32>>()   /* x [..., I] */ \
                                    .Arg<ffi::Buffer<kType<W>>>()   /* w [(L,) O, I] */ \
                                    .Arg<ffi::Buffer<ffi::S32>>()   /* layer [] */  \
                                    .Ret<ffi::Buffer<ffi::F32>>()); /* y [..., O] */

SPECJAX_FEW_ROWS(specjax_few_rows, float)
SPECJAX_FEW_ROWS(specjax_few_rows_bf16, bf16)

// bfloat16 weights times bfloat16 activations: the pair products above where the CPU has
// AVX512_BF16; elsewhere x widened to float32 (exact) and the bfloat16 kernel's law, as before.
static ffi::Error FewRowsBf16Pairs(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x,
                                   ffi::Buffer<ffi::BF16> w, ffi::Buffer<ffi::S32> layer,
                                   ffi::ResultBuffer<ffi::F32> y) {
  int64_t first, w_dims[2];
  if (!layer_of(w.dimensions(), 2, layer, &first, w_dims))
    return ffi::Error::InvalidArgument("w must be [O, I] or [L, O, I] with layer in [0, L)");
  const int64_t n_out = w_dims[0], n_in = w_dims[1];
  if (n_in == 0 || x.element_count() % n_in != 0)
    return ffi::Error::InvalidArgument("x's last axis must be w's I");
  const bf16* xd = static_cast<const bf16*>(x.untyped_data());
  const bf16* wd = static_cast<const bf16*>(w.untyped_data()) + first;
  float* yd = y->typed_data();
  const int64_t T = x.element_count() / n_in;
  std::unique_ptr<float[]> widened;
  if (!kBf16Pairs) {
    widened.reset(new float[T * n_in]);
    for (int64_t k = 0; k < T * n_in; ++k) widened[k] = to_float(xd[k]);
  }
  const float* xf = widened.get();
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t chunk = std::max<int64_t>(4 * R, (n_out / (8 * threads) + R - 1) / R * R);
  parallel_for(pool, (n_out + chunk - 1) / chunk, n_out * n_in * int64_t{sizeof(bf16)},
               [=](int64_t c) {
    const int64_t o0 = c * chunk, o1 = std::min(n_out, (c + 1) * chunk);
    if constexpr (kBf16Pairs)
      span(xd, wd, yd, T, n_in, n_out, o0, o1);
    else
      span(xf, wd, yd, T, n_in, n_out, o0, o1);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_few_rows_bf16_pairs, FewRowsBf16Pairs,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()  /* x [..., I] */
                                  .Arg<ffi::Buffer<ffi::BF16>>()  /* w [(L,) O, I] */
                                  .Arg<ffi::Buffer<ffi::S32>>()   /* layer [] */
                                  .Ret<ffi::Buffer<ffi::F32>>()); /* y [..., O] */

// The name of the bfloat16 product's instruction path (`specjax.kernels.paths`).
extern "C" const char* specjax_bf16_path() { return kBf16Pairs ? "avx512-bf16" : "widened"; }

// The product with 8-bit weights: values [O, I] int8, scales [O, I / block] float16.
// The two 8-bit operands of one layer (`layer_of`): values [O, I] and scales [O, I / block].
static bool eight_bit_layer(ffi::Buffer<ffi::S8> values, ffi::Buffer<ffi::F16> scales,
                            ffi::Buffer<ffi::S32> layer, const int8_t** q, const uint16_t** d,
                            int64_t* w_dims, int64_t* s_dims) {
  int64_t w_first, s_first;
  if (!layer_of(values.dimensions(), 2, layer, &w_first, w_dims) ||
      !layer_of(scales.dimensions(), 2, layer, &s_first, s_dims) ||
      values.dimensions().size() != scales.dimensions().size() || s_dims[0] != w_dims[0] ||
      s_dims[1] == 0)
    return false;
  *q = static_cast<const int8_t*>(values.untyped_data()) + w_first;
  *d = static_cast<const uint16_t*>(scales.untyped_data()) + s_first;
  return true;
}

static ffi::Error FewRowsQ8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                            ffi::Buffer<ffi::S8> values, ffi::Buffer<ffi::F16> scales,
                            ffi::Buffer<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> y) {
  int64_t w_dims[2], s_dims[2];
  const int8_t* q;
  const uint16_t* d;
  if (!eight_bit_layer(values, scales, layer, &q, &d, w_dims, s_dims))
    return ffi::Error::InvalidArgument("values must be [(L,) O, I] and scales "
                                       "[(L,) O, I / block], with layer in [0, L)");
  const int64_t n_out = w_dims[0], n_in = w_dims[1], block = n_in / s_dims[1];
  if (block * s_dims[1] != n_in || block % VW != 0)
    return ffi::Error::InvalidArgument("the scales' blocks must split I into whole vectors");
  if (x.element_count() % n_in != 0)
    return ffi::Error::InvalidArgument("x's last axis must be w's I");
  const float* xd = x.typed_data();
  const Q8Rows wd{q, d, block};
  float* yd = y->typed_data();
  const int64_t T = x.element_count() / n_in;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t chunk = std::max<int64_t>(4 * R, (n_out / (8 * threads) + R - 1) / R * R);
  parallel_for(pool, (n_out + chunk - 1) / chunk, n_out * n_in, [=](int64_t c) {
    span(xd, wd, yd, T, n_in, n_out, c * chunk, std::min(n_out, (c + 1) * chunk));
  });
  return ffi::Error::Success();
}

// Both products with 8-bit weights (this one and q8_0's, below) take these operands.
#define SPECJAX_EIGHT_BIT_PRODUCT(name, fn)                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, fn,                                            \
                                ffi::Ffi::Bind()                                     \
                                    .Ctx<ffi::ThreadPool>()                          \
                                    .Arg<ffi::Buffer<ffi::F32>>()   /* x [..., I] */ \
                                    .Arg<ffi::Buffer<ffi::S8>>()    /* values [(L,) O, I] */ \
                                    .Arg<ffi::Buffer<ffi::F16>>()   /* scales [(L,) O, I / B] */ \
                                    .Arg<ffi::Buffer<ffi::S32>>()   /* layer [] */  \
                                    .Ret<ffi::Buffer<ffi::F32>>()); /* y [..., O] */

SPECJAX_EIGHT_BIT_PRODUCT(specjax_few_rows_q8, FewRowsQ8)

// ---------------------------------------------------------------------------------------------
// The q8_0 product: 8-bit weights times 8-bit activations, llama.cpp's Q8_0 x Q8_0.
//
// In: x [T, I] float32, values [O, I] int8 and scales [O, I / B] float16 (the weights). x is
// quantised per row and block of B inputs first (quantize_rows, below: xq int8 and dx, each
// block's float16 scale). Out: y [T, O] float32, each output by this law (ggml's reference
// vec_dot_q8_0_q8_0, every operation rounded on its own, nothing fused):
//
//   acc = 0
//   for each block b in order:
//     sumi = sum over the block of values[o, i] * xq[t, i]       (an integer: exact)
//     acc  = acc + float(sumi) * (float(scales[o, b]) * dx[t, b])
//
// The integer sums are exact whatever computes them, so only the float operations need an
// order, and every path here, and XLA's (`specjax.model.linear`), does them in this one: a
// one-token step, a verify call and a prefill give the same bits on every instruction set.
// (float(scales) * dx is exact too: two float16 values' product fits a float32.)
//
// With AVX-512 VNNI and blocks of 32, 16 outputs are computed at once, one per lane: a tile of
// 16 rows of w is transposed (per block, eight vectors of 16 lanes x 4 bytes, byte group g of
// each row in lane `row`), then each activation row's 4-byte groups are broadcast and
// multiplied in with VPDPBUSD (unsigned x signed bytes, summed into int32 lanes). VPDPBUSD's
// unsigned operand is the weights + 128 (their sign bit flipped), so 128 times the block's
// sum of activations is taken off again.
// Elsewhere each output is summed on its own.

// A float32 as the nearest float16 (ties to even; its bits), as XLA's conversion gives it.
static inline uint16_t float_to_half(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t sign = (u >> 16) & 0x8000u, magnitude = u & 0x7fffffffu;
  if (magnitude >= 0x7f800000u)                             // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (magnitude < 0x38800000u) {                            // a float16 subnormal (or zero)
    // magnitude * 2^24 rounded to an integer, ties to even: the subnormal's mantissa.
    float scaled;
    const uint32_t m = magnitude;
    std::memcpy(&scaled, &m, sizeof scaled);
    scaled *= 16777216.0f;                                  // exact (a power of two)
    const uint32_t whole = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(whole);
    const uint32_t mantissa = whole + (rest > 0.5f || (rest == 0.5f && (whole & 1u)));
    return static_cast<uint16_t>(sign | mantissa);
  }
  // Normal: drop 13 mantissa bits, ties to even (a carry into the exponent is right).
  const uint32_t rebased = magnitude - 0x38000000u;          // exponent - 112
  const uint32_t half = (rebased + 0x0fffu + ((rebased >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign | half);
#endif
}

// Rows x [T, I] quantised per block of `block` inputs, as `specjax.model.quant.quantize_rows`
// (ggml's quantize_row_q8_0_ref): scale = max |x| / 127, value = x * (1 / scale) rounded half
// away from zero, the scale rounded to float16. Gives the values (xq), 128 times each block's
// sum of values (bias: what VPDPBUSD's unsigned weights add, below), and the float16 scales
// as float32 (dx).
static void quantize_rows(const float* x, int64_t T, int64_t n_in, int64_t block, int8_t* xq,
                          int32_t* bias, float* dx) {
  const int64_t blocks = n_in / block;
#if defined(__AVX512F__)
  // Blocks of 32 as two vectors, by the same operations: the maximum is exact in any order,
  // the multiply is rounded once as below, the truncation is the cast's, the rest exact.
  if (block == 32) {
    for (int64_t k = 0; k < T * blocks; ++k) {
      const float* xb = x + k * 32;
      const __m512 lo = _mm512_loadu_ps(xb), hi = _mm512_loadu_ps(xb + 16);
      const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
      const float scale = top / 127.0f;
      const __m512 inverse = _mm512_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
      __m512i sum = _mm512_setzero_si512();
      for (int half = 0; half < 2; ++half) {
        const __m512 v = _mm512_mul_ps(half ? hi : lo, inverse);
        __m512i whole = _mm512_cvttps_epi32(v);                         // toward zero
        const __m512 rest = _mm512_sub_ps(v, _mm512_cvtepi32_ps(whole));
        const __mmask16 up = _mm512_cmp_ps_mask(rest, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
        const __mmask16 down = _mm512_cmp_ps_mask(rest, _mm512_set1_ps(-0.5f), _CMP_LE_OQ);
        whole = _mm512_mask_add_epi32(whole, up, whole, _mm512_set1_epi32(1));
        whole = _mm512_mask_sub_epi32(whole, down, whole, _mm512_set1_epi32(1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + k * 32 + 16 * half),
                         _mm512_cvtepi32_epi8(whole));
        sum = _mm512_add_epi32(sum, whole);
      }
      bias[k] = 128 * _mm512_reduce_add_epi32(sum);
      dx[k] = half_to_float(float_to_half(scale));
    }
    return;
  }
#endif
  for (int64_t k = 0; k < T * blocks; ++k) {
    const float* xb = x + k * block;
    float top = 0.0f;
    for (int64_t i = 0; i < block; ++i) top = std::max(top, std::fabs(xb[i]));
    const float scale = top / 127.0f;
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    int32_t sum = 0;
    for (int64_t i = 0; i < block; ++i) {
      const float v = xb[i] * inverse;
      int32_t whole = static_cast<int32_t>(v);              // toward zero
      const float rest = v - static_cast<float>(whole);
      whole += (rest >= 0.5f) - (rest <= -0.5f);
      xq[k * block + i] = static_cast<int8_t>(whole);
      sum += whole;
    }
    bias[k] = 128 * sum;
    dx[k] = half_to_float(float_to_half(scale));
  }
}

static inline int32_t block_dot(const int8_t* a, const int8_t* b, int64_t n) {
  int32_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += int32_t{a[i]} * int32_t{b[i]};
  return s;
}

// Output o of rows [t0, t1), summed on its own (any block size, any instruction set).
static void q8_0_output(const int8_t* xq, const float* dx, const int8_t* q, const uint16_t* d,
                        float* y, int64_t t0, int64_t t1, int64_t o, int64_t n_in,
                        int64_t n_out, int64_t block) {
  const int64_t blocks = n_in / block;
  for (int64_t t = t0; t < t1; ++t) {
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t sumi = block_dot(q + o * n_in + b * block, xq + t * n_in + b * block, block);
      const float scale = half_to_float(d[o * blocks + b]) * dx[t * blocks + b];
      const float term = static_cast<float>(sumi) * scale;
      acc = acc + term;
    }
    y[t * n_out + o] = acc;
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
constexpr bool kVnniTiles = true;

// The vpermt2d indices of the tile transpose, in three stages of 8 two-source permutes each.
// Stage 1 takes A_k = [row 2k | row 2k + 1] (8 dwords each) in pairs and gives, for rows
// 4m..4m+3, dwords 4h..4h+3 of each; stage 2, for rows 8p..8p+7, dwords 4h+2q, 4h+2q+1; stage 3,
// for all 16 rows, dword 4h+2q+r: lane j is row j's.
struct TransposeIndex {
  alignas(64) int32_t s1[2][16], s2[2][16], s3[2][16];
  TransposeIndex() {
    for (int v = 0; v < 2; ++v)
      for (int l = 0; l < 16; ++l) {
        const int row1 = l / 4, row2 = l / 2;
        s1[v][l] = (row1 < 2 ? 0 : 16) + (row1 % 2) * 8 + 4 * v + l % 4;
        s2[v][l] = (row2 < 4 ? 0 : 16) + (row2 % 4) * 4 + 2 * v + l % 2;
        s3[v][l] = (l < 8 ? 0 : 16) + 2 * (l % 8) + v;
      }
  }
};
static const TransposeIndex kTranspose;

// Rows q[0..15] (n_in apart), block b (32 bytes each) -> w[g], g = 0..7: lane j = bytes
// 4g..4g+3 of row j.
static inline void transpose_tile(const int8_t* q, int64_t n_in, __m512i w[8]) {
  __m512i a[8], s1[8], s2[8];
  for (int k = 0; k < 8; ++k)
    a[k] = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(q + (2 * k) * n_in))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + (2 * k + 1) * n_in)), 1);
  for (int v = 0; v < 2; ++v) {
    const __m512i i1 = _mm512_load_si512(kTranspose.s1[v]);
    for (int m = 0; m < 4; ++m) s1[2 * m + v] = _mm512_permutex2var_epi32(a[2 * m], i1, a[2 * m + 1]);
  }
  // s1[2m + h]: rows 4m..4m+3, dwords 4h..4h+3.
  for (int q2 = 0; q2 < 2; ++q2) {
    const __m512i i2 = _mm512_load_si512(kTranspose.s2[q2]);
    for (int p = 0; p < 2; ++p)
      for (int h = 0; h < 2; ++h)
        s2[4 * p + 2 * h + q2] =
            _mm512_permutex2var_epi32(s1[2 * (2 * p) + h], i2, s1[2 * (2 * p + 1) + h]);
  }
  // s2[4p + 2h + q]: rows 8p..8p+7, dwords 4h+2q, 4h+2q+1.
  for (int r = 0; r < 2; ++r) {
    const __m512i i3 = _mm512_load_si512(kTranspose.s3[r]);
    for (int h = 0; h < 2; ++h)
      for (int q2 = 0; q2 < 2; ++q2)
        w[4 * h + 2 * q2 + r] =
            _mm512_permutex2var_epi32(s2[2 * h + q2], i3, s2[4 + 2 * h + q2]);
  }
}

#ifndef Q80_PREFETCH
#define Q80_PREFETCH 8
#endif
constexpr int64_t kQ80PrefetchTiles = Q80_PREFETCH;

// Rows of x computed together against one tile: their float sums stay in registers.
constexpr int kTileRows = 8;

// Outputs [o, o + 16) of every row: the tile's blocks transposed once into `packed`
// (blocks x 8 vectors, sign bits flipped), with their scales, then kTileRows rows at a time.
static void q8_0_tile(const int8_t* xq, const int32_t* bias, const float* dx, const int8_t* q,
                      const uint16_t* d, float* y, int64_t T, int64_t o, int64_t n_in,
                      int64_t n_out, __m512i* packed, __m512* scale) {
  const int64_t blocks = n_in / 32;
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < blocks; ++b) {
    const int8_t* tile = q + o * n_in + b * 32;
    // The tile kQ80PrefetchTiles tiles ahead (16 rows, contiguous), in order: a block's share
    // of its 64-byte lines per block.
    {
      const int8_t* ahead = q + (o + 16 * kQ80PrefetchTiles) * n_in;
      const int64_t lines = (16 * n_in + 63) / 64, per = (lines + blocks - 1) / blocks;
      for (int64_t l = b * per; l < std::min(lines, (b + 1) * per); ++l)
        __builtin_prefetch(ahead + 64 * l);
    }
    transpose_tile(tile, n_in, packed + 8 * b);
    for (int g = 0; g < 8; ++g) packed[8 * b + g] = _mm512_xor_si512(packed[8 * b + g], sign);
  }
  // The 16 rows' scales of each block: 32-bit gathers, each bringing a row's float16 scales of
  // blocks b and b + 1 (the last block of an odd count alone, in the low half).
  const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5,
                                                         4, 3, 2, 1, 0),
                                        _mm512_set1_epi32(static_cast<int32_t>(blocks)));
  for (int64_t b = 0; b < blocks; b += 2) {
    const uint16_t* first = d + o * blocks + b;
    if (b + 1 < blocks) {
      const __m512i pairs = _mm512_i32gather_epi32(at, first, 2);
      scale[b] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pairs));
      scale[b + 1] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)));
    } else {
      alignas(64) float s[16];
      for (int j = 0; j < 16; ++j) s[j] = half_to_float(first[j * blocks]);
      scale[b] = _mm512_load_ps(s);
    }
  }
  for (int64_t t0 = 0; t0 < T; t0 += kTileRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, T - t0));
    __m512 acc[kTileRows];
    for (int r = 0; r < kTileRows; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const __m512i* w = packed + 8 * b;
      for (int r = 0; r < rows; ++r) {
        const int8_t* xr = xq + (t0 + r) * n_in + b * 32;
        // Four chains of two, so the multiplies overlap.
        __m512i s[4];
        for (int g = 0; g < 4; ++g) {
          int32_t group;
          std::memcpy(&group, xr + 4 * g, 4);
          s[g] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[g], _mm512_set1_epi32(group));
        }
        for (int g = 4; g < 8; ++g) {
          int32_t group;
          std::memcpy(&group, xr + 4 * g, 4);
          s[g - 4] = _mm512_dpbusd_epi32(s[g - 4], w[g], _mm512_set1_epi32(group));
        }
        const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(_mm512_add_epi32(s[0], s[1]),
                                                              _mm512_add_epi32(s[2], s[3])),
                                             _mm512_set1_epi32(bias[(t0 + r) * blocks + b]));
        const __m512 term = _mm512_mul_ps(
            _mm512_cvtepi32_ps(sum),
            _mm512_mul_ps(scale[b], _mm512_set1_ps(dx[(t0 + r) * blocks + b])));
        acc[r] = _mm512_add_ps(acc[r], term);
      }
    }
    for (int r = 0; r < rows; ++r) {
      alignas(64) float out[16];
      _mm512_store_ps(out, acc[r]);
      std::memcpy(y + (t0 + r) * n_out + o, out, sizeof out);
    }
  }
}
#else
constexpr bool kVnniTiles = false;
#endif

static ffi::Error FewRowsQ80(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                             ffi::Buffer<ffi::S8> values, ffi::Buffer<ffi::F16> scales,
                             ffi::Buffer<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> y) {
  int64_t w_dims[2], s_dims[2];
  const int8_t* q;
  const uint16_t* d;
  if (!eight_bit_layer(values, scales, layer, &q, &d, w_dims, s_dims))
    return ffi::Error::InvalidArgument("values must be [(L,) O, I] and scales "
                                       "[(L,) O, I / block], with layer in [0, L)");
  const int64_t n_out = w_dims[0], n_in = w_dims[1], blocks = s_dims[1], block = n_in / blocks;
  if (block * blocks != n_in) return ffi::Error::InvalidArgument("blocks must split I");
  if (n_in == 0 || x.element_count() % n_in != 0)
    return ffi::Error::InvalidArgument("x's last axis must be the weights' I");
  const int64_t T = x.element_count() / n_in;
  std::unique_ptr<int8_t[]> xq(new int8_t[T * n_in]);
  std::unique_ptr<int32_t[]> bias(new int32_t[T * blocks]);
  std::unique_ptr<float[]> dx(new float[T * blocks]);
  quantize_rows(x.typed_data(), T, n_in, block, xq.get(), bias.get(), dx.get());
  const int8_t* xd = xq.get();
  const int32_t* xb = bias.get();
  const float* sd = dx.get();
  float* yd = y->typed_data();
  const int64_t tiles = kVnniTiles && block == 32 ? n_out / 16 : 0;
  // Work items: 4 tiles of 16 outputs each, then the outputs left one by one in groups of 16.
  constexpr int64_t kTilesPerItem = 4;
  const int64_t tile_items = (tiles + kTilesPerItem - 1) / kTilesPerItem;
  const int64_t rest0 = tiles * 16, rest_items = (n_out - rest0 + 15) / 16;
  parallel_for(pool, tile_items + rest_items, n_out * n_in, [=](int64_t item) {
    if (item < tile_items) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
      std::unique_ptr<__m512i[]> packed(new __m512i[blocks * 8]);
      std::unique_ptr<__m512[]> scale(new __m512[blocks]);
      for (int64_t k = item * kTilesPerItem; k < std::min(tiles, (item + 1) * kTilesPerItem); ++k)
        q8_0_tile(xd, xb, sd, q, d, yd, T, k * 16, n_in, n_out, packed.get(), scale.get());
#endif
      return;
    }
    const int64_t o0 = rest0 + (item - tile_items) * 16;
    for (int64_t o = o0; o < std::min(n_out, o0 + 16); ++o)
      q8_0_output(xd, sd, q, d, yd, 0, T, o, n_in, n_out, block);
  });
  return ffi::Error::Success();
}

SPECJAX_EIGHT_BIT_PRODUCT(specjax_few_rows_q8_0, FewRowsQ80)

// The q8_0 product on weights packed in the kernel's order (`specjax.model.quant.pack_tiles`):
// for each tile of 16 outputs, block by block of 32 inputs, 544 bytes: the block's values as 8
// groups of 4 inputs, each group for the 16 outputs in turn (64 bytes: one vector, lane j
// output j's 4 values), sign bits flipped (value + 128), then the 16 outputs' float16 scales.
// The same law as above, to the bit; what changes is the work: the tile transpose is done
// once, when the weights are loaded, so a call streams the matrix in order, one contiguous
// run a tile, and spends its arithmetic on the products alone. A one-token step then reads
// the weights at the memory's speed, and a verify call's rows each cost 8 VPDPBUSD, a
// conversion, two multiplies and an add per 512 bytes of weights.
//
// VPDPBUSD multiplies unsigned bytes (the flipped weights) by signed bytes (the activations),
// so each block's sum is sum (w + 128) * x; 128 times the block's sum of x is subtracted by
// starting the sum from minus it (`bias`): integers, exact. Then, per block in order,
// acc = acc + float(sumi) * (scale_w * dx), each operation rounded on its own, as
// `q8_0_output` and XLA's `q8_0_law` do.

constexpr int64_t kPackedBlock = 16 * 32 + 16 * 2;

// fn(k, t0, n) for rows [0, T) in ceil(T / most) groups k as even as they split (9 rows in
// groups of at most 8: 5 and 4, not 8 and 1).
template <typename Fn>
static void even_groups(int64_t T, int64_t most, Fn fn) {
  const int64_t groups = (T + most - 1) / most;
  for (int64_t k = 0, t0 = 0; k < groups; ++k) {
    const int64_t n = T / groups + (k < T % groups);
    fn(k, t0, n);
    t0 += n;
  }
}

// fn(std::integral_constant<int, n>) for n in [1, most]: the row count as a compile-time
// constant, for kernels whose per-row accumulators are registers.
template <int most, typename Fn>
static void with_rows(int64_t n, Fn fn) {
  if constexpr (most > 0) {
    if (n == most) return fn(std::integral_constant<int, most>{});
    with_rows<most - 1>(n, fn);
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
// How far ahead of a block's bytes the stream is prefetched.
constexpr int64_t kPackedAhead = 2048;

// Rows [t0, t0 + rows) against one packed tile (16 outputs): `rows` accumulators in
// registers, each block's 8 weight vectors loaded once for all of them.
template <int rows>
static void q8_0_packed_rows(const int8_t* xq, const int32_t* bias, const float* dx,
                             const int8_t* tile, float* y, int64_t t0, int64_t o,
                             int64_t n_in, int64_t n_out, bool prefetch) {
  const int64_t blocks = n_in / 32;
  __m512 acc[rows];
  for (int r = 0; r < rows; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const int8_t* p = tile + b * kPackedBlock;
    if (prefetch)
      for (int64_t line = 0; line < kPackedBlock; line += 64)
        __builtin_prefetch(p + kPackedAhead + line);
    __m512i w[8];
    for (int g = 0; g < 8; ++g) w[g] = _mm512_loadu_si512(p + 64 * g);
    const __m512 scale =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 512)));
    for (int r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      const int8_t* xr = xq + t * n_in + b * 32;
      int32_t group[8];
      std::memcpy(group, xr, sizeof group);
      // Two chains of four; the first starts from minus the bias.
      __m512i s0 = _mm512_set1_epi32(-bias[t * blocks + b]), s1 = _mm512_setzero_si512();
      for (int g = 0; g < 8; g += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[g], _mm512_set1_epi32(group[g]));
        s1 = _mm512_dpbusd_epi32(s1, w[g + 1], _mm512_set1_epi32(group[g + 1]));
      }
      const __m512 term = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                        _mm512_mul_ps(scale, _mm512_set1_ps(dx[t * blocks + b])));
      acc[r] = _mm512_add_ps(acc[r], term);
    }
  }
  for (int r = 0; r < rows; ++r) _mm512_storeu_ps(y + (t0 + r) * n_out + o, acc[r]);
}

// Rows handled together against a tile, at most: 8 weight vectors, a scale vector, the rows'
// accumulators and a few temporaries stay within AVX-512's 32 registers.
constexpr int kPackedRows = 12;

// Every row against one tile, in even groups; the first streams the tile from memory (and
// prefetches ahead), the others find it in L1.
static void q8_0_packed_tile(const int8_t* xq, const int32_t* bias, const float* dx,
                             const int8_t* tile, float* y, int64_t T, int64_t o, int64_t n_in,
                             int64_t n_out) {
  even_groups(T, kPackedRows, [&](int64_t k, int64_t t0, int64_t n) {
    with_rows<kPackedRows>(n, [&](auto rows) {
      q8_0_packed_rows<decltype(rows)::value>(xq, bias, dx, tile, y, t0, o, n_in, n_out, k == 0);
    });
  });
}
constexpr bool kPackedVnni = true;
#else
constexpr bool kPackedVnni = false;
#endif

#if !(defined(__AVX512VNNI__) && defined(__AVX512F__)) && defined(__AVX2__)
// AVX2 hosts: a 256-bit vector holds one group for half a tile (8 outputs), so each half is
// its own pass. With AVX-VNNI the block sums are VPDPBUSD's as above, in 256 bits. Without it,
// VPMADDUBSW multiplies unsigned by signed bytes into saturating 16-bit pairs, so the operands
// are |w| (at most 128) and x with w's sign (x is at most 127 in size, the quantiser's range):
// a pair's sum is at most 2 * 128 * 127 = 32,512, under the saturation, and VPMADDWD with ones
// adds the pairs into each output's 4-value group, exactly. Either way the sums are the same
// integers and the float epilogue the law's, so the bits are the other paths'.
constexpr bool kPackedAvx2 = true;

// Rows of x a pass holds (8 weight vectors, a scale, the rows' accumulators and temporaries in
// AVX2's 16 registers).
constexpr int kAvx2Rows = 4;

template <int rows>
static void q8_0_packed_half(const int8_t* xq, const int32_t* bias, const float* dx,
                             const int8_t* tile, float* y, int64_t t0, int64_t o, int half,
                             int64_t n_in, int64_t n_out) {
  const int64_t blocks = n_in / 32;
  const __m256i sign = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[rows];
  for (int r = 0; r < rows; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const int8_t* p = tile + b * kPackedBlock;
    __m256i w[8];
    for (int g = 0; g < 8; ++g)
      w[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * g + 32 * half));
#if !defined(__AVXVNNI__)
    for (int g = 0; g < 8; ++g) w[g] = _mm256_xor_si256(w[g], sign);   // the values again
    __m256i magnitude[8];
    for (int g = 0; g < 8; ++g) magnitude[g] = _mm256_abs_epi8(w[g]);
    const __m256i ones = _mm256_set1_epi16(1);
#endif
#if defined(__F16C__)
    const __m256 scale = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 512 + 16 * half)));
#else
    alignas(32) float scales[8];
    for (int j = 0; j < 8; ++j) {
      uint16_t h;
      std::memcpy(&h, p + 512 + 16 * half + 2 * j, sizeof h);
      scales[j] = half_to_float(h);
    }
    const __m256 scale = _mm256_load_ps(scales);
#endif
    for (int r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      int32_t group[8];
      std::memcpy(group, xq + t * n_in + b * 32, sizeof group);
#if defined(__AVXVNNI__)
      __m256i sum = _mm256_set1_epi32(-bias[t * blocks + b]);
      for (int g = 0; g < 8; ++g)
        sum = _mm256_dpbusd_avx_epi32(sum, w[g], _mm256_set1_epi32(group[g]));
#else
      __m256i sum = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(group[g]), w[g]);
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(
            _mm256_maddubs_epi16(magnitude[g], signed_x), ones));
      }
#endif
      const __m256 term = _mm256_mul_ps(_mm256_cvtepi32_ps(sum),
                                        _mm256_mul_ps(scale, _mm256_set1_ps(dx[t * blocks + b])));
      acc[r] = _mm256_add_ps(acc[r], term);
    }
  }
  for (int r = 0; r < rows; ++r) _mm256_storeu_ps(y + (t0 + r) * n_out + o + 8 * half, acc[r]);
}

// Every row against one tile: each half of its outputs in turn, the rows in even groups.
static void q8_0_packed_tile(const int8_t* xq, const int32_t* bias, const float* dx,
                             const int8_t* tile, float* y, int64_t T, int64_t o, int64_t n_in,
                             int64_t n_out) {
  for (int half = 0; half < 2; ++half)
    even_groups(T, kAvx2Rows, [&](int64_t, int64_t t0, int64_t n) {
      with_rows<kAvx2Rows>(n, [&](auto rows) {
        q8_0_packed_half<decltype(rows)::value>(xq, bias, dx, tile, y, t0, o, half, n_in, n_out);
      });
    });
}
#else
constexpr bool kPackedAvx2 = false;
#endif

// The name of the q8_0 product's instruction path, for `bench`'s header
// (`specjax.kernels.paths`).
extern "C" const char* specjax_q8_0_path() {
#if defined(__AVXVNNI__)
  const char* avx2 = "avx-vnni";
#else
  const char* avx2 = "avx2";
#endif
  return kPackedVnni ? "avx512-vnni" : kPackedAvx2 ? avx2 : "per-output";
}

// Without AVX2, the same product from the weights' values and scales (`FewRowsQ80`'s
// per-output path): the packed order serves vector dot products alone.
static ffi::Error FewRowsQ80Tiles(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                  ffi::Buffer<ffi::S8> tiles, ffi::Buffer<ffi::S8> values,
                                  ffi::Buffer<ffi::F16> scales, ffi::Buffer<ffi::S32> layer,
                                  ffi::ResultBuffer<ffi::F32> y) {
  if (!kPackedVnni && !kPackedAvx2) return FewRowsQ80(pool, x, values, scales, layer, y);
  int64_t first, dims[2];
  if (!layer_of(tiles.dimensions(), 2, layer, &first, dims) || dims[1] % kPackedBlock != 0)
    return ffi::Error::InvalidArgument("tiles must be [(L,) O / 16, blocks * 544] with layer "
                                       "in [0, L)");
  const int64_t n_tiles = dims[0], blocks = dims[1] / kPackedBlock, n_in = blocks * 32;
  const int64_t n_out = n_tiles * 16;
  if (n_in == 0 || x.element_count() % n_in != 0)
    return ffi::Error::InvalidArgument("x's last axis must be the weights' I (32 a block)");
  const int64_t T = x.element_count() / n_in;
  std::unique_ptr<int8_t[]> xq(new int8_t[T * n_in]);
  std::unique_ptr<int32_t[]> bias(new int32_t[T * blocks]);
  std::unique_ptr<float[]> dx(new float[T * blocks]);
  quantize_rows(x.typed_data(), T, n_in, 32, xq.get(), bias.get(), dx.get());
  const int8_t* xd = xq.get();
  const int32_t* xb = bias.get();
  const float* sd = dx.get();
  const int8_t* wd = static_cast<const int8_t*>(tiles.untyped_data()) + first;
  float* yd = y->typed_data();
  // Work items of 4 tiles (2 KiB of weights a block row): small enough that the threads end
  // together, each item one contiguous run of the stream.
  constexpr int64_t kTilesPerItem = 4;
  const int64_t items = (n_tiles + kTilesPerItem - 1) / kTilesPerItem;
  parallel_for(pool, items, n_tiles * dims[1], [=](int64_t item) {
#if (defined(__AVX512VNNI__) && defined(__AVX512F__)) || defined(__AVX2__)
    for (int64_t k = item * kTilesPerItem; k < std::min(n_tiles, (item + 1) * kTilesPerItem); ++k)
      q8_0_packed_tile(xd, xb, sd, wd + k * dims[1], yd, T, k * 16, n_in, n_out);
#else
    (void)item, (void)xd, (void)xb, (void)sd, (void)wd, (void)yd, (void)n_out;
#endif
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_few_rows_q8_0_tiles, FewRowsQ80Tiles,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   /* x [..., I] */
                                  .Arg<ffi::Buffer<ffi::S8>>()    /* tiles [(L,) O/16, X] */
                                  .Arg<ffi::Buffer<ffi::S8>>()    /* values [(L,) O, I] */
                                  .Arg<ffi::Buffer<ffi::F16>>()   /* scales [(L,) O, I/32] */
                                  .Arg<ffi::Buffer<ffi::S32>>()   /* layer [] */
                                  .Ret<ffi::Buffer<ffi::F32>>()); /* y [..., O] */

// ---------------------------------------------------------------------------------------------
// Attention of a few queries to a layer's KV cache, reading only the slots in use.
//
// q [B, T, N, H]; the cache's keys [B, K, H, S] and values [B, K, S, H] (specjax.model.cache);
// mask [B, T, S] (which slots each query reads); limit [B] (each row's slots past limit are
// never read: one past its last query's slot). Out: [B, T, N, H].
//
// XLA reads a cache prefix only through a static window, a copy of it, and its products over
// few query rows run far below the memory's speed (SmolLM2, 2,048 slots: a one-token step cost
// 34 ms attending to the whole buffer, 20 ms through a 1,024-slot window, 14-15 ms with this
// kernel). Here each (row, key
// head, chunk of CHUNK slots) is one item of work: the G = N / K query heads of the T queries
// that share the key head score the chunk's keys, take a softmax that is local to the chunk
// (its maximum, its sum) and sum the chunk's values; the chunks are then merged with the usual
// rescaling (the softmax of the whole row, computed in pieces, as flash-decoding does).

constexpr int64_t CHUNK = 256;

// Query rows handled together: their scores share each load of a key vector.
constexpr int QB = 4;

// The largest head size whose last few slots' scores go through vectors (`chunk_rows`).
constexpr int64_t kTailHeads = 256;

// e^x for a vector, to about 2 ulp: x = n ln 2 + f with |f| <= ln 2 / 2, e^f by its degree-6
// Taylor polynomial, times 2^n built in the exponent bits. Below -87.3 (e^x under float's
// smallest normal; -inf included, a masked slot) it gives 0.
static inline Vec exp_vec(Vec x) {
  typedef int32_t IVec __attribute__((vector_size(VW * sizeof(float))));
  const IVec underflow = x < -87.3f;
  x = underflow ? Vec{} - 87.3f : x;
  // Round x / ln 2 to the nearest integer: adding 1.5 * 2^23 leaves no fraction bits.
  const Vec n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const Vec f = x - n * 0.693145751953125f - n * 1.42860682030941723e-6f;
  const Vec p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120
                + f * (1.0f / 720))))));
  const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  Vec power;
  std::memcpy(&power, &bits, sizeof power);
  return underflow ? Vec{} : p * power;
}

// One chunk [s0, s1) of one key head for QB query rows (the first `group` of them real):
// scores, the chunk's softmax maximum and sum, and the unnormalised output, into part (per
// row: max, sum, out[H], `stride` floats apart).
template <typename C>
static void chunk_rows(const float* const* qr, const bool* const* mr, const C* kb,
                       const C* vb, int64_t S, int64_t H, int64_t s0, int64_t s1,
                       float scale, int64_t group, float* part, int64_t stride) {
  const int64_t n = s1 - s0;
  alignas(64) float scores[QB][CHUNK];
  // Scores: for SV vectors of slots at a time, the dot products of each row's query with their
  // keys, accumulated over H in registers. Keys are [H, S]: each h is a run of SV vectors
  // (contiguous), prefetched one block ahead, since H runs at once are more streams than the
  // hardware prefetchers follow.
  constexpr int SV = 4;
  int64_t s = 0;
  for (; s + SV * VW <= n; s += SV * VW) {
    Vec acc[QB][SV] = {};
    for (int64_t h = 0; h < H; ++h) {
      const C* kr = kb + h * S + s0 + s;
      // One prefetch per 64-byte cache line of the next block.
      for (int line = 0; line < SV * VW; line += 64 / int{sizeof(C)})
        __builtin_prefetch(kr + SV * VW + line);
      for (int v = 0; v < SV; ++v) {
        const Vec kv = load(kr + v * VW);
        for (int j = 0; j < QB; ++j) acc[j][v] = fma(Vec{} + qr[j][h], kv, acc[j][v]);
      }
    }
    for (int j = 0; j < QB; ++j) std::memcpy(&scores[j][s], acc[j], sizeof acc[j]);
  }
  for (; s + VW <= n; s += VW) {
    Vec acc[QB] = {};
    for (int64_t h = 0; h < H; ++h) {
      const Vec kv = load(kb + h * S + s0 + s);
      for (int j = 0; j < QB; ++j) acc[j] = fma(Vec{} + qr[j][h], kv, acc[j]);
    }
    for (int j = 0; j < QB; ++j) std::memcpy(&scores[j][s], &acc[j], sizeof(Vec));
  }
  // The last slots (fewer than a vector): their keys copied, widened, into a vector's width
  // padded with zeros, then the same products as above. Each lane is one slot's sum, by the
  // same fmas in the same order as in a whole vector, so a slot's score does not depend on
  // whether it falls in the tail (one by one, a verify call's new slots cost a chain of H
  // dependent fmas each: a fifth of a 9-token call's time on SmolLM2).
  if (s < n && H <= kTailHeads) {
    alignas(64) float tail[kTailHeads * VW];
    for (int64_t h = 0; h < H; ++h)
      for (int l = 0; l < VW; ++l)
        tail[h * VW + l] = s + l < n ? to_float(kb[h * S + s0 + s + l]) : 0.0f;
    Vec acc[QB] = {};
    for (int64_t h = 0; h < H; ++h) {
      const Vec kv = load(tail + h * VW);
      for (int j = 0; j < QB; ++j) acc[j] = fma(Vec{} + qr[j][h], kv, acc[j]);
    }
    for (int j = 0; j < QB; ++j) {
      float lane[VW];
      std::memcpy(lane, &acc[j], sizeof lane);
      for (int64_t l = 0; s + l < n; ++l) scores[j][s + l] = lane[l];
    }
    s = n;
  }
  for (; s < n; ++s)
    for (int j = 0; j < QB; ++j) {
      float acc = 0.0f;
      for (int64_t h = 0; h < H; ++h)
        acc = std::fma(qr[j][h], to_float(kb[h * S + s0 + s]), acc);
      scores[j][s] = acc;
    }
  // Each row's masked scores, their maximum and their sum of exponentials: each in slot order
  // for its row, the rows' chains interleaved (one row's is a chain of dependent operations).
  float top[QB], total[QB];
  for (int64_t j = 0; j < group; ++j) top[j] = -INFINITY, total[j] = 0.0f;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < group; ++j) {
      float& score = scores[j][i];
      score = mr[j][s0 + i] ? score * scale : -INFINITY;
      top[j] = std::max(top[j], score);
    }
  for (int64_t j = 0; j < group; ++j) {
    if (top[j] == -INFINITY) continue;
    float* sc = scores[j];
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
      Vec e = exp_vec(load(sc + i) - top[j]);
      std::memcpy(sc + i, &e, sizeof e);
    }
    // The tail through exp_vec too (padded with -inf, which gives 0): a slot's weight must
    // not depend on whether the slots in use put it in a whole vector or in the tail, or a
    // verify call (more slots in use) and a one-token step weigh the same key differently
    // (seen: greedy Medusa in bfloat16 left greedy autoregressive decoding on SmolLM2).
    // Likewise every multiply-add of the scores and outputs is fused explicitly.
    if (i < n) {
      alignas(64) float tail[VW];
      for (int l = 0; l < VW; ++l) tail[l] = i + l < n ? sc[i + l] : -INFINITY;
      Vec e = exp_vec(load(tail) - top[j]);
      std::memcpy(tail, &e, sizeof e);
      for (const int64_t first = i; i < n; ++i) sc[i] = tail[i - first];
    }
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < group; ++j)
      if (top[j] != -INFINITY) total[j] += scores[j][i];
  for (int64_t j = 0; j < group; ++j) {
    part[j * stride] = top[j];
    part[j * stride + 1] = total[j];
    float* o = part + j * stride + 2;
    for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
  }
  // Outputs: each element the fmas p * v + o over the slots in order (masked slots have weight
  // 0), in registers: OV vectors of H for every row of the group, each value vector loaded
  // once for them all. A row that sees no slot keeps its zeros.
  constexpr int OV = 4;
  int64_t h = 0;
  for (; h + OV * VW <= H; h += OV * VW) {
    Vec acc[QB][OV] = {};
    for (int64_t i = 0; i < n; ++i) {
      const C* vr = vb + (s0 + i) * H + h;
      Vec value[OV];
      for (int v = 0; v < OV; ++v) value[v] = load(vr + v * VW);
      for (int j = 0; j < QB; ++j) {
        const Vec weight = Vec{} + scores[j][i];
        for (int v = 0; v < OV; ++v) acc[j][v] = fma(weight, value[v], acc[j][v]);
      }
    }
    for (int64_t j = 0; j < group; ++j)
      if (top[j] != -INFINITY) std::memcpy(part + j * stride + 2 + h, acc[j], sizeof acc[j]);
  }
  for (; h + VW <= H; h += VW) {
    Vec acc[QB] = {};
    for (int64_t i = 0; i < n; ++i) {
      const Vec value = load(vb + (s0 + i) * H + h);
      for (int j = 0; j < QB; ++j) acc[j] = fma(Vec{} + scores[j][i], value, acc[j]);
    }
    for (int64_t j = 0; j < group; ++j)
      if (top[j] != -INFINITY) std::memcpy(part + j * stride + 2 + h, &acc[j], sizeof acc[j]);
  }
  for (; h < H; ++h)
    for (int64_t j = 0; j < group; ++j) {
      if (top[j] == -INFINITY) continue;
      float acc = 0.0f;
      for (int64_t i = 0; i < n; ++i)
        acc = std::fma(scores[j][i], to_float(vb[(s0 + i) * H + h]), acc);
      part[j * stride + 2 + h] = acc;
    }
}

// A bfloat16 cache reaches the kernel as its bits (uint16): the decoder carries it so, because
// XLA's CPU backend writes a bfloat16 array by converting all of it to float32 and back.
template <typename C>
constexpr ffi::DataType kCacheType = std::is_same_v<C, float> ? ffi::F32 : ffi::U16;

template <typename C>
static ffi::Error FewQueryAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                                    ffi::Buffer<kCacheType<C>> keys,
                                    ffi::Buffer<kCacheType<C>> values,
                                    ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::S32> limit,
                                    ffi::Buffer<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions();
  int64_t k_first, v_first, kd[4], vd[4];
  if (qd.size() != 4 || !layer_of(keys.dimensions(), 4, layer, &k_first, kd) ||
      !layer_of(values.dimensions(), 4, layer, &v_first, vd))
    return ffi::Error::InvalidArgument("q must be [B, T, N, H] and the cache [(L,) B, K, H, S] "
                                       "with layer in [0, L)");
  const int64_t B = qd[0], T = qd[1], N = qd[2], H = qd[3], K = kd[1], S = kd[3];
  if (kd[0] != B || kd[2] != H || N % K != 0)
    return ffi::Error::InvalidArgument("q [B, T, N, H] and keys [B, K, H, S] do not match");
  const int64_t G = N / K, rows = T * G;
  const int32_t* L = limit.typed_data();
  // Only the chunks below the largest limit are work; the buffer past them is never touched.
  int64_t used = 0;
  for (int64_t b = 0; b < B; ++b) used = std::max<int64_t>(used, std::min<int64_t>(S, L[b]));
  const int64_t chunks = (used + CHUNK - 1) / CHUNK;
  const float scale = 1.0f / std::sqrt(static_cast<float>(H));
  const float* Q = q.typed_data();
  const C* Kc = static_cast<const C*>(keys.untyped_data()) + k_first;
  const C* Vc = static_cast<const C*>(values.untyped_data()) + v_first;
  const bool* M = mask.typed_data();
  // Per item, per query row: the chunk's maximum score, its sum of exponentials, and its
  // unnormalised output [H]. Chunks past a row's limit are left unused (max = -inf).
  const int64_t stride = H + 2;
  std::unique_ptr<float[]> partial(new float[B * K * chunks * rows * stride]);

  int64_t bytes = 0;                                      // of keys and values read
  for (int64_t b = 0; b < B; ++b) bytes += std::min<int64_t>(S, L[b]) * K * H * 2 * sizeof(C);
  parallel_for(pool, B * K * chunks, bytes, [&](int64_t item) {
    const int64_t b = item / (K * chunks), kh = (item / chunks) % K, c = item % chunks;
    float* part = &partial[item * rows * stride];
    const int64_t s0 = c * CHUNK, s1 = std::min<int64_t>({S, s0 + CHUNK, int64_t{L[b]}});
    for (int64_t r = 0; r < rows; ++r) part[r * stride] = -INFINITY;
    if (s1 <= s0) return;
    const C* kb = Kc + ((b * K + kh) * H) * S;            // [H, S] of this key head
    const C* vb = Vc + ((b * K + kh) * S) * H;            // [S, H]
    for (int64_t r = 0; r < rows; r += QB) {              // QB query rows at a time
      const int64_t group = std::min<int64_t>(QB, rows - r);
      const float* qr[QB];
      const bool* mr[QB];
      for (int64_t j = 0; j < QB; ++j) {
        const int64_t row = r + std::min<int64_t>(j, group - 1);  // repeats the last row
        const int64_t t = row / G, g = row % G;
        qr[j] = Q + ((b * T + t) * N + kh * G + g) * H;
        mr[j] = M + (b * T + t) * S;
      }
      chunk_rows(qr, mr, kb, vb, S, H, s0, s1, scale, group, part + r * stride, stride);
    }
  });

  // Merge the chunks of each (row, key head, query row): rescale each to the largest maximum.
  float* O = out->typed_data();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kh = 0; kh < K; ++kh)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r / G, g = r % G;
        float top = -INFINITY;
        for (int64_t c = 0; c < chunks; ++c)
          top = std::max(top, partial[(((b * K + kh) * chunks + c) * rows + r) * stride]);
        float* o = O + ((b * T + t) * N + kh * G + g) * H;
        for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
        float total = 0.0f;
        for (int64_t c = 0; c < chunks; ++c) {
          const float* part = &partial[(((b * K + kh) * chunks + c) * rows + r) * stride];
          if (part[0] == -INFINITY) continue;
          const float weight = std::exp(part[0] - top);
          total += weight * part[1];
          for (int64_t h = 0; h < H; ++h) o[h] = std::fma(weight, part[2 + h], o[h]);
        }
        // Every query sees at least its own slot, so total > 0 (a padded query, which may see
        // nothing, gets zeros: its output is never used).
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (int64_t h = 0; h < H; ++h) o[h] *= inv;
      }
  return ffi::Error::Success();
}

#define SPECJAX_FEW_QUERY_ATTENTION(name, C)                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, FewQueryAttention<C>,                           \
                                ffi::Ffi::Bind()                                      \
                                    .Ctx<ffi::ThreadPool>()                           \
                                    .Arg<ffi::Buffer<ffi::F32>>()  /* q [B, T, N, H] */ \
                                    .Arg<ffi::Buffer<kCacheType<C>>>() /* keys [(L,) B, K, H, S] */ \
                                    .Arg<ffi::Buffer<kCacheType<C>>>() /* values [(L,) B, K, S, H] */ \
                                    .Arg<ffi::Buffer<ffi::PRED>>() /* mask [B, T, S] */ \
                                    .Arg<ffi::Buffer<ffi::S32>>()  /* limit [B] */      \
                                    .Arg<ffi::Buffer<ffi::S32>>()  /* layer [] */       \
                                    .Ret<ffi::Buffer<ffi::F32>>()); /* out [B, T, N, H] */

SPECJAX_FEW_QUERY_ATTENTION(specjax_few_query_attention, float)
SPECJAX_FEW_QUERY_ATTENTION(specjax_few_query_attention_bf16, bf16)

// ---------------------------------------------------------------------------------------------
// RoPE for calls of a few tokens, in two calls: the tables once per forward call, then each
// layer's queries and keys. Why not XLA's elementwise code: XLA fuses the rotation into its
// consumers, and the keys' consumer is the cache write, a transpose whose code differs with the
// call's width; a key rotated in a 9-token call and in a one-token step came out a rounding
// apart (float32 and int8 models, SmolLM2), and so did the logits after it. Here each value is
// computed by the same written operations whatever the call:
//
//   angle = float(position) * inv_freq[j]                  (one rounding, as XLA computes it)
//   c, s  = cosf(angle), sinf(angle)                       (the C library's, per value)
//   out[j]        = fma(x[j],        c, -(x[j + H/2] * s))  (rotate_half: [-x2, x1])
//   out[j + H/2]  = fma(x[j + H/2],  c,   x[j] * s)

// positions [B, T] int32, inv_freq [H/2] -> tables [2, B, T, H/2]: the cosines, then the sines.
static ffi::Error RopeTables(ffi::Buffer<ffi::S32> positions, ffi::Buffer<ffi::F32> inv_freq,
                             ffi::ResultBuffer<ffi::F32> tables) {
  const int64_t n = positions.element_count(), half = inv_freq.element_count();
  if (tables->element_count() != 2 * n * half)
    return ffi::Error::InvalidArgument("tables must be [2, B, T, H/2]");
  const int32_t* p = positions.typed_data();
  const float* f = inv_freq.typed_data();
  float* cosines = tables->typed_data();
  float* sines = cosines + n * half;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < half; ++j) {
      const float angle = static_cast<float>(p[i]) * f[j];
      cosines[i * half + j] = std::cos(angle);
      sines[i * half + j] = std::sin(angle);
    }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_rope_tables, RopeTables,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()   /* positions [B, T] */
                                  .Arg<ffi::Buffer<ffi::F32>>()   /* inv_freq [H/2] */
                                  .Ret<ffi::Buffer<ffi::F32>>()); /* tables [2, B, T, H/2] */

// x [B, T, N, H] rotated by tables [2, B, T, H/2] into y.
static void rotate(const float* X, int64_t rows, int64_t N, int64_t H, const float* cosines,
                   const float* sines, float* Y) {
  const int64_t half = H / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = X + (r * N + n) * H;
      float* yr = Y + (r * N + n) * H;
      for (int64_t j = 0; j < half; ++j) {
        const float c = cosines[r * half + j], s = sines[r * half + j];
        const float x1 = xr[j], x2 = xr[j + half];
        yr[j] = std::fma(x1, c, -(x2 * s));
        yr[j + half] = std::fma(x2, c, x1 * s);
      }
    }
}

// A layer's queries q [B, T, N, H] and keys k [B, T, K, H], rotated in one call (one custom
// call a layer, not two) by tables [2, B, T, H/2].
static ffi::Error Rope(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                       ffi::Buffer<ffi::F32> tables, ffi::ResultBuffer<ffi::F32> q_out,
                       ffi::ResultBuffer<ffi::F32> k_out) {
  auto dq = q.dimensions(), dk = k.dimensions();
  if (dq.size() != 4 || dk.size() != 4 || dq[3] % 2 != 0 || dk[3] != dq[3] ||
      dk[0] != dq[0] || dk[1] != dq[1])
    return ffi::Error::InvalidArgument("q: [B, T, N, H] and k: [B, T, K, H]");
  const int64_t rows = dq[0] * dq[1], H = dq[3], half = H / 2;
  if (tables.element_count() != 2 * rows * half)
    return ffi::Error::InvalidArgument("tables must be [2, B, T, H/2] for q [B, T, N, H]");
  const float* cosines = tables.typed_data();
  const float* sines = cosines + rows * half;
  rotate(q.typed_data(), rows, dq[2], H, cosines, sines, q_out->typed_data());
  rotate(k.typed_data(), rows, dk[2], H, cosines, sines, k_out->typed_data());
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_rope, Rope,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()   /* q [B, T, N, H] */
                                  .Arg<ffi::Buffer<ffi::F32>>()   /* k [B, T, K, H] */
                                  .Arg<ffi::Buffer<ffi::F32>>()   /* tables [2, B, T, H/2] */
                                  .Ret<ffi::Buffer<ffi::F32>>()   /* q rotated */
                                  .Ret<ffi::Buffer<ffi::F32>>()); /* k rotated */
