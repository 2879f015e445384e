// The few-row product y[T, O] = x[T, I] . w[O, I]^T (float32) that a decoding step's verify
// call needs, as an XLA FFI custom call for the CPU. See specjax/model/few_rows.py.
//
// Why: with 2 to 32 rows, XLA's and OpenBLAS's matrix products on a CPU cost 2 to 3 times a
// one-row product (a mat-vec) over the same weights, although the rows add little arithmetic:
// the weights are what costs, and their bytes are the same. This kernel reads each weight once
// from memory, whatever T is:
//
//   - w is walked in blocks of R consecutive rows (R x I floats, a few KiB, stays in L1);
//   - each block is multiplied with every row of x (a few KiB more, in L1), TB rows at a time,
//     with R x TB vector accumulators held in registers: one vector load of w serves TB
//     products, one load of x serves R;
//   - a software prefetch keeps the next bytes of w in flight while the block computes;
//   - the rows of w are split into chunks that XLA's intra-op threads and the calling thread
//     take in turn (an atomic counter), so both cores stream.
//
// Each output is sum over I of w[o, i] * x[t, i], accumulated lane-wise in chunks of VW, then
// the lanes summed in a fixed order, then the tail (I mod VW) added: the same operations for
// every (o, t), whatever T, the block sizes or the thread that computes it. So a row of x gets
// the same bits in a call of 2 rows as in a call of 30.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

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
constexpr int64_t kPrefetch = 4096;

typedef float Vec __attribute__((vector_size(VW * sizeof(float))));

static inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
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

static inline float sum_lanes(Vec v) {
  float lane[VW];
  std::memcpy(lane, &v, sizeof v);
  float s = 0.0f;
  for (int j = 0; j < VW; ++j) s += lane[j];
  return s;
}

// y[t, r] for the `rows` rows of w at `w` and the `cols` rows of x at `x` (rows <= R,
// cols <= TB; templated so the accumulators are registers). n_in is I, n_out is y's row stride.
template <int rows, int cols>
static void block(const float* x, const float* w, float* y, int64_t n_in, int64_t n_out) {
  Vec acc[rows][cols];
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < cols; ++t) acc[r][t] = Vec{};
  int64_t i = 0;
  for (; i + VW <= n_in; i += VW) {
    Vec wv[rows];
    for (int r = 0; r < rows; ++r) {
      wv[r] = load(w + r * n_in + i);
      __builtin_prefetch(w + r * n_in + i + kPrefetch);
    }
    for (int t = 0; t < cols; ++t) {
      Vec xv = load(x + t * n_in + i);
      // Keep xv in a register: left alone, the compiler folds the load into every product
      // below, which makes the loop load-bound (measured: 1.8x slower for 5 rows in cache).
      keep_in_register(xv);
      for (int r = 0; r < rows; ++r) acc[r][t] += wv[r] * xv;
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < cols; ++t) {
      float s = sum_lanes(acc[r][t]);
      for (int64_t j = i; j < n_in; ++j) s += w[r * n_in + j] * x[t * n_in + j];
      y[t * n_out + r] = s;
    }
}

// The last `left` rows of x (fewer than TB) against `rows` rows of w: block<rows, left>.
template <int rows, int cols = TB - 1>
static void block_rest(int64_t left, const float* x, const float* w, float* y, int64_t n_in,
                       int64_t n_out) {
  if constexpr (cols > 0) {
    if (left == cols) return block<rows, cols>(x, w, y, n_in, n_out);
    block_rest<rows, cols - 1>(left, x, w, y, n_in, n_out);
  }
}

// Every row of x (T of them) against `rows` rows of w, TB rows of x at a time.
template <int rows>
static void block_all_x(const float* x, const float* w, float* y, int64_t T, int64_t n_in,
                        int64_t n_out) {
  int64_t t = 0;
  for (; t + TB <= T; t += TB) block<rows, TB>(x + t * n_in, w, y + t * n_out, n_in, n_out);
  block_rest<rows>(T - t, x + t * n_in, w, y + t * n_out, n_in, n_out);
}

// Outputs [o0, o1) of every row.
static void span(const float* x, const float* w, float* y, int64_t T, int64_t n_in,
                 int64_t n_out, int64_t o0, int64_t o1) {
  int64_t o = o0;
  for (; o + R <= o1; o += R) block_all_x<R>(x, w + o * n_in, y + o, T, n_in, n_out);
  for (; o < o1; ++o) block_all_x<1>(x, w + o * n_in, y + o, T, n_in, n_out);
}

// One call's work, shared by the threads that take its chunks. Held by shared_ptr: a helper
// task that starts after the call has returned finds no chunk left and lets it go.
struct Work {
  const float* x;
  const float* w;
  float* y;
  int64_t T, n_in, n_out, chunk, chunks;
  std::atomic<int64_t> next{0}, done{0};

  void take_chunks() {
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      span(x, w, y, T, n_in, n_out, c * chunk, std::min(n_out, (c + 1) * chunk));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

static ffi::Error FewRows(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                          ffi::ResultBuffer<ffi::F32> y) {
  auto w_dims = w.dimensions();
  if (w_dims.size() != 2) return ffi::Error::InvalidArgument("w must be [O, I]");
  const int64_t n_out = w_dims[0], n_in = w_dims[1];
  if (n_in == 0 || x.element_count() % n_in != 0)
    return ffi::Error::InvalidArgument("x's last axis must be w's I");
  auto work = std::make_shared<Work>();
  work->x = x.typed_data();
  work->w = w.typed_data();
  work->y = y->typed_data();
  work->T = x.element_count() / n_in;
  work->n_in = n_in;
  work->n_out = n_out;
  // About 16 chunks, each a multiple of R rows: small enough that the threads finish together.
  work->chunk = std::max<int64_t>(4 * R, (n_out / 16 + R - 1) / R * R);
  work->chunks = (n_out + work->chunk - 1) / work->chunk;
  // The caller takes chunks too, so one helper fewer than the pool's threads is enough to use
  // every core (XLA's pool has one thread per core).
  const int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, work->chunks - 1);
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([work] { work->take_chunks(); });
  work->take_chunks();
  while (work->done.load(std::memory_order_acquire) < work->chunks) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_few_rows, FewRows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // x [..., I]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // w [O, I]
                                  .Ret<ffi::Buffer<ffi::F32>>()); // y [..., O]
