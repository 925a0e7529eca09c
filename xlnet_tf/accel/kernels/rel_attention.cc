// XLNet's relative attention as CPU kernels (float32). For every (batch row, head) the forward forms the
// scores of a tile of query rows -- content (AC), position (BD, after the relative shift) and segment (EF)
// terms, the blocked mask -- normalises them and multiplies by the values, all while the tile's scores sit in
// cache. The TensorFlow graph instead writes every [b, n, q, k] score tensor to memory several times
// (AC, BD, the score cluster, the softmax) and moves the heads with four transposes; these kernels read the
// projections in their natural [b, len, n, h] layout and write [b, q, n, h].
//
// Three ops: XlnetRelAttention (inference; positional rows in factored form), XlnetRelAttentionTrain (a
// training forward: dense positional rows, the attention-dropout keep mask as an input, and the probabilities
// as a second output) and XlnetRelAttentionGrad (its backward, from the saved probabilities).
//
// Same formulas as xlnet_tf/attention.py (attend_rows): score(i, j) = (q_i + r_w) s . k_j
// + (q_i + r_r) s . kr[qlen - i + j] + (q_i + r_s) s . seg[diff(i, j)], -1e30 where blocked, softmax over j,
// (times keep(i, j) / (1 - dropatt) in training), times v_j; s = 1 / sqrt(d_head). Summation order differs
// from the graph's (outputs agree to ~1e-6).
//
// Built by `python -m xlnet_tf.accel.kernels build` with -march=native; the vector code uses GCC vector extensions,
// so the same source compiles for AVX-512 (16 floats) and AVX2 (8 floats).

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/threadpool.h"

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::errors::InvalidArgument;

// VL: floats per vector; GEMM tiles are TILE_ROWS x TILE_VECS vectors of accumulators (24 of AVX-512's 32
// registers, 12 of AVX2's 16).
#if defined(__AVX512F__)
constexpr int VL = 16;
constexpr int TILE_VECS = 4;
#else
constexpr int VL = 8;
constexpr int TILE_VECS = 2;
#endif
constexpr int TILE_ROWS = 6;
constexpr int TILE = 32;  // query rows per tile
constexpr float MASK_VALUE = -1e30f;

typedef float vf __attribute__((vector_size(VL * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VL * sizeof(int32_t))));
typedef uint8_t vb __attribute__((vector_size(VL)));

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof(v)); return v; }
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
inline vf bcast(float x) { return vf{} + x; }
// VL bools as a lane mask (-1 where true), for `mask ? a : b` (bytes -> int32 lanes is one vpmovzxbd).
inline vi load_bool(const bool* p) {
#if defined(__AVX512F__)
  const vi w = (vi)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif defined(__AVX2__)
  const vi w = (vi)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#else  // GCC converts lane by lane here
  vb b;
  std::memcpy(&b, p, sizeof(b));
  const vi w = __builtin_convertvector(b, vi);
#endif
  return w != 0;
}
inline float hsum(vf v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(v);
#else
  float t = 0.0f;
  for (int l = 0; l < VL; ++l) t += v[l];
  return t;
#endif
}
inline float hmax(vf v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps(v);
#else
  float t = v[0];
  for (int l = 1; l < VL; ++l) t = std::max(t, v[l]);
  return t;
#endif
}
// A 64-byte aligned float buffer (vector loads of a whole cache line).
class Buffer {
 public:
  explicit Buffer(size_t n) : p_(static_cast<float*>(std::aligned_alloc(64, round64(n * sizeof(float))))) {}
  ~Buffer() { std::free(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() { return p_; }
  float& operator[](size_t i) { return p_[i]; }

 private:
  static size_t round64(size_t b) { return (b + 63) / 64 * 64; }
  float* p_;
};

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// exp for x <= 0 (Cephes' single-precision polynomial, ~1 ulp); exactly 0 below -87.3 (where expf underflows
// to denormals), as the masked scores (-1e30 minus the row maximum) need.
inline vf vexp(vf x) {
  const vf lo = bcast(-87.3f);
  vf under = x < lo ? bcast(0.0f) : bcast(1.0f);
  x = x < lo ? lo : x;
  vf fx = x * 1.44269504088896341f + 0.5f;
  vf t = __builtin_convertvector(__builtin_convertvector(fx, vi), vf);
  t = t > fx ? t - 1.0f : t;  // floor
  x = x - t * 0.693359375f + t * 2.12194440e-4f;
  vf p = bcast(1.9875691500e-4f);
  p = p * x + 1.3981999507e-3f;
  p = p * x + 8.3334519073e-3f;
  p = p * x + 4.1665795894e-2f;
  p = p * x + 1.6666665459e-1f;
  p = p * x + 5.0000001201e-1f;
  vf y = p * (x * x) + x + 1.0f;
  vi e = (__builtin_convertvector(t, vi) + 127) << 23;
  vf pow2;
  std::memcpy(&pow2, &e, sizeof(pow2));
  return y * pow2 * under;
}

// The one GEMM micro-kernel: C[R x G VL] (+)= diag(scale) A[R x kd] B[kd x G VL], row strides lda, ldb, ldc.
// TA: A is stored transposed (element (r, d) at a[d * lda + r]); ACC: add to C (then scale must be null);
// scale may be null (no scaling).
template <int R, int G, bool TA, bool ACC>
inline void gemm_tile(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int kd,
                      const float* scale) {
  vf acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = ACC ? load(c + r * ldc + g * VL) : vf{};
#pragma GCC unroll 4
  for (int d = 0; d < kd; ++d) {
    vf bb[G];
    for (int g = 0; g < G; ++g) bb[g] = load(b + d * ldb + g * VL);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const vf x = bcast(TA ? a[d * lda + r] : a[r * lda + d]);
      for (int g = 0; g < G; ++g) acc[r][g] += x * bb[g];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) store(c + r * ldc + g * VL, scale ? acc[r][g] * scale[r] : acc[r][g]);
}

// One column panel of G VL columns, every row tile (the panel of B stays in L1 meanwhile).
template <int G, bool TA, bool ACC>
void gemm_panel(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m, int kd,
                const float* scale) {
  for (int i = 0; i < m; i += TILE_ROWS) {
    const float* ai = TA ? a + i : a + i * lda;
    float* ci = c + i * ldc;
    const float* si = scale ? scale + i : nullptr;
    switch (std::min(TILE_ROWS, m - i)) {
#define XLNET_TILE(R) case R: gemm_tile<R, G, TA, ACC>(ai, lda, b, ldb, ci, ldc, kd, si); break;
      XLNET_TILE(1) XLNET_TILE(2) XLNET_TILE(3) XLNET_TILE(4) XLNET_TILE(5) XLNET_TILE(6)
#undef XLNET_TILE
    }
  }
}

// C[m x n] (+)= diag(scale) A[m x kd] B[kd x n]; n a multiple of VL; see gemm_tile for TA, ACC and scale.
template <bool TA = false, bool ACC = false>
void gemm(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m, int n, int kd,
          const float* scale = nullptr) {
  int j = 0;
  for (; j + TILE_VECS * VL <= n; j += TILE_VECS * VL)
    gemm_panel<TILE_VECS, TA, ACC>(a, lda, b + j, ldb, c + j, ldc, m, kd, scale);
  switch ((n - j) / VL) {  // the last, narrower panel
    case 1: gemm_panel<1, TA, ACC>(a, lda, b + j, ldb, c + j, ldc, m, kd, scale); break;
    case 2: gemm_panel<2, TA, ACC>(a, lda, b + j, ldb, c + j, ldc, m, kd, scale); break;
    case 3: gemm_panel<3, TA, ACC>(a, lda, b + j, ldb, c + j, ldc, m, kd, scale); break;
  }
}

// dst[d * ldd + j] = src[j * lds + d] for j < rows, d < cols (cols a multiple of VL).
void transpose_rows(const float* src, int lds, int rows, int cols, float* dst, int ldd) {
  int j = 0;
#if defined(__AVX512F__)
  // 16 x 16 blocks in registers: 16 row loads, four rounds of shuffles, 16 column stores.
  for (; j + 16 <= rows; j += 16) {
    for (int d = 0; d < cols; d += 16) {
      __m512 r[16], t[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + static_cast<int64_t>(j + i) * lds + d);
      for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
      }
      for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
      }
      // r[i] now holds column d + i of rows j .. j + 15.
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + static_cast<int64_t>(d + i) * ldd + j, r[i]);
    }
  }
#endif
  for (int d = 0; d < cols; ++d)
    for (int t = j; t < rows; ++t) dst[static_cast<int64_t>(d) * ldd + t] = src[static_cast<int64_t>(t) * lds + d];
}

// One score row: row[j] += bd[j] (+ the segment term: es, or eo where diff[j]), MASK_VALUE where blocked[j];
// then row[j] = exp(row[j] - max). Returns 1 / sum. diff and blocked may be null.
float softmax_row(float* __restrict row, const float* __restrict bd, int kl, const bool* __restrict diff,
                  float es, float eo, const bool* __restrict blocked) {
  const vf e0 = bcast(es), eo_v = bcast(eo), masked = bcast(MASK_VALUE);
  vf vmax = bcast(-3.4e38f);
  int j = 0;
  for (; j + VL <= kl; j += VL) {
    vf x = load(row + j) + load(bd + j);
    if (diff) x += load_bool(diff + j) ? eo_v : e0;
    if (blocked) x = load_bool(blocked + j) ? masked : x;
    store(row + j, x);
    vmax = x > vmax ? x : vmax;
  }
  float mx = hmax(vmax);
  for (int t = j; t < kl; ++t) {
    float x = row[t] + bd[t];
    if (diff) x += diff[t] ? eo : es;
    if (blocked && blocked[t]) x = MASK_VALUE;
    row[t] = x;
    mx = std::max(mx, x);
  }
  vf vsum = vf{};
  const vf vm = bcast(mx);
  for (j = 0; j + VL <= kl; j += VL) {
    const vf e = vexp(load(row + j) - vm);
    store(row + j, e);
    vsum += e;
  }
  float sum = hsum(vsum);
  if (j < kl) {
    vf tail = bcast(-100.0f);  // exp -> 0
    for (int l = 0; j + l < kl; ++l) tail[l] = row[j + l] - mx;
    const vf e = vexp(tail);
    for (int l = 0; j + l < kl; ++l) {
      row[j + l] = e[l];
      sum += e[l];
    }
  }
  return 1.0f / sum;
}

// Shapes and inputs shared by the three ops.
struct Problem {
  int b = 0, ql = 0, kl = 0, n = 0, h = 0, nh = 0, blk_b = 0;
  float s = 0.0f;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *rw = nullptr, *rr = nullptr, *rs = nullptr,
              *seg = nullptr;
  const bool *diff = nullptr, *blocked = nullptr;  // null: no segment term / nothing blocked
  // Widths: scores padded to whole vectors; a tile's positional scores start at an aligned column pa <= p0
  // (p0 - pa < VL) and span at most wpad columns; rpad covers every positional row a tile reads
  // (pa + wpad <= qlen + wpad). Row strides are one vector longer than the widths: rows a power-of-two apart
  // would share L1 sets.
  int kpad = 0, wpad = 0, rpad = 0, kld = 0, wld = 0, rld = 0;
  int64_t bq(int bi, int i) const { return static_cast<int64_t>(bi) * ql + i; }  // row of [b, q, ...]
  int64_t bk(int bi, int j) const { return static_cast<int64_t>(bi) * kl + j; }  // row of [b, k, ...]
  int64_t prob_row(int bi, int hi, int i) const { return ((static_cast<int64_t>(bi) * n + hi) * ql + i) * kl; }
  const bool* diff_row(int bi, int i) const { return diff ? diff + bq(bi, i) * kl : nullptr; }
  const bool* blocked_row(int bi, int i) const {
    return blocked ? blocked + (static_cast<int64_t>(blk_b == 1 ? 0 : bi) * ql + i) * kl : nullptr;
  }
  // The band of positional columns tile rows [i0, i1) read: from pa, width w; row i starts at pa + off(i).
  int p0(int i1) const { return ql - i1 + 1; }
  int pa(int i1) const { return p0(i1) / VL * VL; }
  int band(int i1, int m) const { return round_up(p0(i1) - pa(i1) + kl + m - 1, VL); }
  int off(int i1, int i) const { return (p0(i1) - pa(i1)) + (i1 - 1 - i); }
};

tensorflow::Status parse(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& rw, const Tensor& rr,
                         const Tensor& rs, const Tensor& seg, const Tensor& diff, const Tensor& blocked, float scale,
                         Problem* p) {
  if (q.dims() != 4 || k.dims() != 4 || v.dims() != 4)
    return InvalidArgument("rel_attention: q, k, v must be [b, len, n, h], got ", q.shape().DebugString(), ", ",
                           k.shape().DebugString(), ", ", v.shape().DebugString());
  p->b = q.dim_size(0), p->ql = q.dim_size(1), p->n = q.dim_size(2), p->h = q.dim_size(3);
  p->kl = k.dim_size(1), p->nh = p->n * p->h;
  if (k.dim_size(0) != p->b || v.shape() != k.shape() || k.dim_size(2) != p->n || k.dim_size(3) != p->h)
    return InvalidArgument("rel_attention: shapes do not agree: q ", q.shape().DebugString(), ", k ",
                           k.shape().DebugString(), ", v ", v.shape().DebugString());
  if (p->h % VL != 0) return InvalidArgument("rel_attention: d_head must be a multiple of ", VL, ", got ", p->h);
  const tensorflow::TensorShape nh_shape({p->n, p->h}), seg_shape({2, p->n, p->h});
  if (rw.shape() != nh_shape || rr.shape() != nh_shape || rs.shape() != nh_shape || seg.shape() != seg_shape)
    return InvalidArgument("rel_attention: r_w, r_r, r_s biases must be [", p->n, ", ", p->h, "] and seg_embed [2, ",
                           p->n, ", ", p->h, "], got ", rw.shape().DebugString(), ", ", rr.shape().DebugString(),
                           ", ", rs.shape().DebugString(), ", ", seg.shape().DebugString());
  const bool has_seg = diff.NumElements() > 0, has_mask = blocked.NumElements() > 0;
  if (has_seg && !(diff.dims() == 3 && diff.dim_size(0) == p->b && diff.dim_size(1) == p->ql &&
                   diff.dim_size(2) == p->kl))
    return InvalidArgument("rel_attention: segment diff must be [b, q, k], got ", diff.shape().DebugString());
  if (has_mask && !(blocked.dims() == 3 && (blocked.dim_size(0) == p->b || blocked.dim_size(0) == 1) &&
                    blocked.dim_size(1) == p->ql && blocked.dim_size(2) == p->kl))
    return InvalidArgument("rel_attention: blocked must be [b|1, q, k], got ", blocked.shape().DebugString());
  p->s = scale;
  p->q = q.flat<float>().data();
  p->k = k.flat<float>().data();
  p->v = v.flat<float>().data();
  p->rw = rw.flat<float>().data();
  p->rr = rr.flat<float>().data();
  p->rs = rs.flat<float>().data();
  p->seg = seg.flat<float>().data();
  p->diff = has_seg ? diff.flat<bool>().data() : nullptr;
  p->blocked = has_mask ? blocked.flat<bool>().data() : nullptr;
  p->blk_b = has_mask ? blocked.dim_size(0) : 0;
  p->kpad = round_up(p->kl, VL);
  p->wpad = round_up(p->kl + TILE - 1 + VL, VL);
  p->rpad = round_up(p->ql + p->wpad, VL);
  p->kld = p->kpad + VL, p->wld = p->wpad + VL, p->rld = p->rpad + VL;
  return absl::OkStatus();
}

// A dense [r, n*h] positional table (training), checked against q's heads.
tensorflow::Status parse_kr(const Tensor& kr, const Problem& p) {
  if (kr.dims() != 2 || kr.dim_size(1) != p.nh)
    return InvalidArgument("rel_attention: positional rows kr must be [r, ", p.nh, "], got ", kr.shape().DebugString());
  return absl::OkStatus();
}

// A [b, n, q, k] tensor (the keep mask, the probabilities), or [0, 0, 0, 0] where `optional`.
tensorflow::Status parse_bnqk(const Tensor& t, const Problem& p, const char* what, bool optional) {
  if (optional && t.NumElements() == 0) return absl::OkStatus();
  const tensorflow::TensorShape want({p.b, p.n, p.ql, p.kl});
  if (t.shape() != want)
    return InvalidArgument("rel_attention: ", what, " must be ", want.DebugString(), optional ? " or [0, 0, 0, 0]" : "",
                           ", got ", t.shape().DebugString());
  return absl::OkStatus();
}

// KR^T of every head, zero beyond the rows given: [n][h][rld], shared by all batch rows; built per head in
// parallel. row(p, hi, dst) writes the h values of positional row p, head hi.
template <typename RowFn>
void build_krt(const Problem& p, int rl, OpKernelContext* ctx, float* krt_all, RowFn row) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  const int rows = std::min(rl, p.rpad), h = p.h, rld = p.rld;
  pool->ParallelFor(p.n, static_cast<int64_t>(rld) * h * 4, [&](int64_t start, int64_t end) {
    Buffer kr(static_cast<size_t>(std::max(rows, 1)) * h);
    for (int64_t hi = start; hi < end; ++hi) {
      for (int r = 0; r < rows; ++r) row(r, static_cast<int>(hi), kr.data() + r * h);
      float* dst = krt_all + static_cast<size_t>(hi) * h * rld;
      for (int d = 0; d < h; ++d) std::fill(dst + static_cast<int64_t>(d) * rld + rows, dst + (d + 1) * rld, 0.0f);
      transpose_rows(kr.data(), h, rows, h, dst, rld);
    }
  });
}

// The biased, scaled queries of tile rows [i0, i0 + m): qw = (q + r_w) s, qr = (q + r_r) s, and (with segments)
// qs = (q + r_s) s (stored when qs is not null) and its two segment scores ef[2 r], ef[2 r + 1] (when ef is not
// null: the forward needs the scores, the backward qs).
void query_rows(const Problem& p, int bi, int hi, int i0, int m, float* qw, float* qr, float* qs, float* ef) {
  const int h = p.h;
  const float *rwh = p.rw + hi * h, *rrh = p.rr + hi * h, *rsh = p.rs + hi * h;
  const float *seg0 = p.seg + hi * h, *seg1 = p.seg + p.nh + hi * h;
  for (int r = 0; r < m; ++r) {
    const float* src = p.q + p.bq(bi, i0 + r) * p.nh + hi * h;
    vf a0 = vf{}, a1 = vf{};
    for (int d = 0; d < h; d += VL) {
      const vf x = load(src + d);
      store(qw + r * h + d, (x + load(rwh + d)) * p.s);
      store(qr + r * h + d, (x + load(rrh + d)) * p.s);
      if (p.diff) {
        const vf y = (x + load(rsh + d)) * p.s;
        if (qs) store(qs + r * h + d, y);
        if (ef) {
          a0 += y * load(seg0 + d);
          a1 += y * load(seg1 + d);
        }
      }
    }
    if (ef) {
      ef[2 * r] = hsum(a0);
      ef[2 * r + 1] = hsum(a1);
    }
  }
}

// Scratch of one forward task.
struct ForwardScratch {
  explicit ForwardScratch(const Problem& p)
      : kt(p.h * p.kld), qw(TILE * p.h), qr(TILE * p.h), sc(TILE * p.kld), bd(TILE * p.wld), ef(2 * TILE),
        inv(TILE) {
    std::fill(kt.data(), kt.data() + p.h * p.kld, 0.0f);  // K^T's padding columns stay zero
  }
  Buffer kt, qw, qr, sc, bd, ef, inv;
};

// The forward of one (batch row, head): out [b, q, n, h]. With prob (training): the probabilities go to
// prob [b, n, q, k] and P.V uses them times keep / (1 - dropatt) (keep may be null: no attention dropout).
void forward_head(const Problem& p, int bi, int hi, const float* krt, ForwardScratch& w, float* out, float* prob,
                  const bool* keep, float keep_scale) {
  const int h = p.h, kl = p.kl, nh = p.nh, kld = p.kld, wld = p.wld;
  transpose_rows(p.k + p.bk(bi, 0) * nh + hi * h, nh, kl, h, w.kt.data(), kld);
  const float* vh = p.v + p.bk(bi, 0) * nh + hi * h;
  const vf ks = bcast(keep_scale), zero = vf{};
  for (int i0 = 0; i0 < p.ql; i0 += TILE) {
    const int m = std::min(TILE, p.ql - i0), i1 = i0 + m;
    query_rows(p, bi, hi, i0, m, w.qw.data(), w.qr.data(), nullptr, w.ef.data());
    gemm(w.qw.data(), h, w.kt.data(), kld, w.sc.data(), kld, m, p.kpad, h);
    const int pa = p.pa(i1);
    gemm(w.qr.data(), h, krt + pa, p.rld, w.bd.data(), wld, m, p.band(i1, m), h);
    for (int r = 0; r < m; ++r) {
      const int i = i0 + r;
      w.inv[r] = softmax_row(w.sc.data() + r * kld, w.bd.data() + r * wld + p.off(i1, i), kl, p.diff_row(bi, i),
                             w.ef[2 * r], w.ef[2 * r + 1], p.blocked_row(bi, i));
    }
    float* oh = out + p.bq(bi, i0) * nh + hi * h;
    if (!prob) {
      gemm(w.sc.data(), kld, vh, nh, oh, nh, m, h, kl, w.inv.data());
      continue;
    }
    for (int r = 0; r < m; ++r) {  // normalise, save, drop
      float* row = w.sc.data() + r * kld;
      float* pr = prob + p.prob_row(bi, hi, i0 + r);
      const bool* kp = keep ? keep + p.prob_row(bi, hi, i0 + r) : nullptr;
      const float inv = w.inv[r];
      int j = 0;
      for (; j + VL <= kl; j += VL) {
        const vf x = load(row + j) * inv;
        store(pr + j, x);
        if (kp) store(row + j, load_bool(kp + j) ? x * ks : zero);
        else store(row + j, x);
      }
      for (; j < kl; ++j) {
        const float x = row[j] * inv;
        pr[j] = x;
        row[j] = kp ? (kp[j] ? x * keep_scale : 0.0f) : x;
      }
    }
    gemm(w.sc.data(), kld, vh, nh, oh, nh, m, h, kl);
  }
}

class RelAttentionOp : public OpKernel {
 public:
  explicit RelAttentionOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
  }

  void Compute(OpKernelContext* ctx) override {
    // Inputs: q [b, q, n, h], k, v [b, k, n, h]; the projected positional encodings in factored form
    // (layers.PositionalBasis): row p of KR is pos_cos[index[p]] + sign[p] * pos_sin[index[p]], pos_sin and
    // pos_cos [R, n*h], index int32 [r], sign [r]; r_w, r_r, r_s [n, h]; seg_embed [2, n, h]; seg_diff bool
    // [b, q, k] or [0, 0, 0] (no segment term); blocked bool [b|1, q, k] or [0, 0, 0] (nothing blocked).
    const Tensor& pos_sin = ctx->input(3);
    const Tensor& pos_cos = ctx->input(4);
    const Tensor& pos_index = ctx->input(5);
    const Tensor& pos_sign = ctx->input(6);
    Problem p;
    OP_REQUIRES_OK(ctx, parse(ctx->input(0), ctx->input(1), ctx->input(2), ctx->input(7), ctx->input(8),
                              ctx->input(9), ctx->input(10), ctx->input(11), ctx->input(12), scale_, &p));
    const int rl = pos_index.NumElements();
    OP_REQUIRES(ctx, pos_sin.dims() == 2 && pos_sin.dim_size(1) == p.nh && pos_cos.shape() == pos_sin.shape() &&
                pos_index.dims() == 1 && pos_sign.shape() == pos_index.shape(),
                InvalidArgument("rel_attention: positional tables must be sin, cos [R, ", p.nh, "] and index, sign "
                                "[r], got ", pos_sin.shape().DebugString(), ", ", pos_cos.shape().DebugString(),
                                ", ", pos_index.shape().DebugString(), ", ", pos_sign.shape().DebugString()));
    const int32_t* idxp = pos_index.flat<int32_t>().data();
    const int n_rows = pos_sin.dim_size(0);
    for (int r = 0; r < rl; ++r)
      OP_REQUIRES(ctx, idxp[r] >= 0 && idxp[r] < n_rows,
                  InvalidArgument("rel_attention: positional index[", r, "] = ", idxp[r], " outside [0, ", n_rows,
                                  ")"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(0).shape(), &out));
    if (out->NumElements() == 0) return;

    const float* sinp = pos_sin.flat<float>().data();
    const float* cosp = pos_cos.flat<float>().data();
    const float* signp = pos_sign.flat<float>().data();
    const int h = p.h, nh = p.nh;
    Buffer krt(static_cast<size_t>(p.n) * h * p.rld);
    build_krt(p, rl, ctx, krt.data(), [&](int r, int hi, float* dst) {
      const float* sn = sinp + static_cast<int64_t>(idxp[r]) * nh + hi * h;
      const float* cs = cosp + static_cast<int64_t>(idxp[r]) * nh + hi * h;
      const vf sg = bcast(signp[r]);
      for (int d = 0; d < h; d += VL) store(dst + d, load(cs + d) + load(sn + d) * sg);
    });
    run_forward(ctx, p, krt.data(), out->flat<float>().data(), nullptr, nullptr, 1.0f);
  }

  // Every (batch row, head) as one task on TensorFlow's intra-op pool.
  static void run_forward(OpKernelContext* ctx, const Problem& p, const float* krt, float* out, float* prob,
                          const bool* keep, float keep_scale) {
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    const int64_t cost = static_cast<int64_t>(p.ql) * (p.kl * 3 + TILE) * p.h * 2;
    pool->ParallelFor(static_cast<int64_t>(p.b) * p.n, cost, [&](int64_t start, int64_t end) {
      ForwardScratch w(p);
      for (int64_t task = start; task < end; ++task) {
        const int bi = task / p.n, hi = task % p.n;
        forward_head(p, bi, hi, krt + static_cast<size_t>(hi) * p.h * p.rld, w, out, prob, keep, keep_scale);
      }
    });
  }

 private:
  float scale_;
};

// Copies a dense [r, n*h] positional table into KR^T (training).
void build_krt_dense(OpKernelContext* ctx, const Problem& p, const Tensor& kr, float* krt) {
  const float* krp = kr.flat<float>().data();
  build_krt(p, kr.dim_size(0), ctx, krt, [&](int r, int hi, float* dst) {
    std::memcpy(dst, krp + static_cast<int64_t>(r) * p.nh + hi * p.h, p.h * sizeof(float));
  });
}

// The training pair's attributes: the query scale 1/sqrt(d_head) and 1 / (1 - dropatt).
class TrainingOpBase : public OpKernel {
 public:
  explicit TrainingOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("keep_scale", &keep_scale_));
  }

 protected:
  float scale_ = 0.0f, keep_scale_ = 1.0f;
};

class RelAttentionTrainOp : public TrainingOpBase {
 public:
  using TrainingOpBase::TrainingOpBase;

  void Compute(OpKernelContext* ctx) override {
    // Inputs: q, k, v, kr [r, n*h], r_w, r_r, r_s, seg_embed, seg_diff, blocked (as XlnetRelAttention), keep
    // bool [b, n, q, k] or [0, 0, 0, 0] (no attention dropout). Outputs: out [b, q, n, h], prob [b, n, q, k].
    Problem p;
    OP_REQUIRES_OK(ctx, parse(ctx->input(0), ctx->input(1), ctx->input(2), ctx->input(4), ctx->input(5),
                              ctx->input(6), ctx->input(7), ctx->input(8), ctx->input(9), scale_, &p));
    const Tensor& kr = ctx->input(3);
    const Tensor& keep = ctx->input(10);
    OP_REQUIRES_OK(ctx, parse_kr(kr, p));
    OP_REQUIRES_OK(ctx, parse_bnqk(keep, p, "keep", true));
    Tensor *out = nullptr, *prob = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(0).shape(), &out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tensorflow::TensorShape({p.b, p.n, p.ql, p.kl}), &prob));
    if (out->NumElements() == 0 || prob->NumElements() == 0) return;
    Buffer krt(static_cast<size_t>(p.n) * p.h * p.rld);
    build_krt_dense(ctx, p, kr, krt.data());
    RelAttentionOp::run_forward(ctx, p, krt.data(), out->flat<float>().data(), prob->flat<float>().data(),
                                keep.NumElements() ? keep.flat<bool>().data() : nullptr,
                                keep.NumElements() ? keep_scale_ : 1.0f);
  }
};

// The backward of one head over every batch row (heads are independent; the batch rows of a head share its
// positional rows, so one task accumulates their gradient). With S the scores, P = softmax(S), D the dropped
// probabilities P keep / (1 - dropatt) and O = D V:
//   dV = D^T dO;  dP = (dO V^T) keep / (1 - dropatt);  dS = P (dP - rowsum(P dP)), 0 where blocked;
//   AC: dQw = dS K, dK = dS^T Qw;  BD: the band dB (dS shifted into the positional columns each row read),
//   dQr = dB KR, dKR = dB^T Qr;  EF: dE = (rowsum of dS where the segments agree, where they differ),
//   dQs = dE seg, dseg = dE^T Qs;  dq = s (dQw + dQr + dQs), d r_w = s sum dQw, d r_r = s sum dQr,
//   d r_s = s sum dQs.
struct GradOutputs {
  float *dq, *dk, *dv, *dkr, *drw, *drr, *drs, *dseg;
};

void backward_head(const Problem& p, int hi, const float* kr, int rl, const float* dout, const float* prob,
                   const bool* keep, float keep_scale, const GradOutputs& g) {
  const int h = p.h, kl = p.kl, nh = p.nh, kld = p.kld, wld = p.wld;
  Buffer vt(h * kld), krp(static_cast<size_t>(p.rpad) * h), dkrp(static_cast<size_t>(p.rpad) * h),
      dkh(static_cast<size_t>(kl) * h), dvh(static_cast<size_t>(kl) * h), qw(TILE * h), qr(TILE * h),
      qs(TILE * h), dpd(TILE * kld), pd(TILE * kld), ds(TILE * kld), dbd(TILE * wld), dqw(TILE * h),
      dqr(TILE * h), de(2 * TILE), acc(5 * h);
  std::fill(vt.data(), vt.data() + h * kld, 0.0f);
  const int rows = std::min(rl, p.rpad);
  for (int r = 0; r < p.rpad; ++r)
    for (int d = 0; d < h; ++d) krp[r * h + d] = r < rows ? kr[static_cast<int64_t>(r) * nh + hi * h + d] : 0.0f;
  std::fill(dkrp.data(), dkrp.data() + static_cast<size_t>(p.rpad) * h, 0.0f);
  std::fill(acc.data(), acc.data() + 5 * h, 0.0f);  // d r_w, d r_r, d r_s, dseg[0], dseg[1]
  float *arw = acc.data(), *arr = arw + h, *ars = arr + h, *as0 = ars + h, *as1 = as0 + h;
  const float *seg0 = p.seg + hi * h, *seg1 = p.seg + nh + hi * h;
  const vf ks = bcast(keep_scale), zero = vf{}, s = bcast(p.s);
  for (int bi = 0; bi < p.b; ++bi) {
    const float* kh = p.k + p.bk(bi, 0) * nh + hi * h;
    transpose_rows(p.v + p.bk(bi, 0) * nh + hi * h, nh, kl, h, vt.data(), kld);
    std::fill(dkh.data(), dkh.data() + static_cast<size_t>(kl) * h, 0.0f);
    std::fill(dvh.data(), dvh.data() + static_cast<size_t>(kl) * h, 0.0f);
    for (int i0 = 0; i0 < p.ql; i0 += TILE) {
      const int m = std::min(TILE, p.ql - i0), i1 = i0 + m;
      query_rows(p, bi, hi, i0, m, qw.data(), qr.data(), qs.data(), nullptr);
      const float* doh = dout + p.bq(bi, i0) * nh + hi * h;
      gemm(doh, nh, vt.data(), kld, dpd.data(), kld, m, p.kpad, h);  // dO V^T
      const int pa = p.pa(i1), wb = p.band(i1, m);
      for (int r = 0; r < m; ++r) {
        const int i = i0 + r;
        const float* pr = prob + p.prob_row(bi, hi, i);
        const bool* kp = keep ? keep + p.prob_row(bi, hi, i) : nullptr;
        const bool* blk = p.blocked_row(bi, i);
        const bool* dif = p.diff_row(bi, i);
        float *dpr = dpd.data() + r * kld, *pdr = pd.data() + r * kld, *dsr = ds.data() + r * kld;
        // D and dP, and rowsum(P dP).
        vf vdot = vf{};
        int j = 0;
        for (; j + VL <= kl; j += VL) {
          const vf x = load(pr + j);
          vf dp = load(dpr + j);
          if (kp) {
            const vi kept = load_bool(kp + j);
            store(pdr + j, kept ? x * ks : zero);
            dp = kept ? dp * ks : zero;
          } else {
            store(pdr + j, x);
          }
          store(dpr + j, dp);
          vdot += x * dp;
        }
        float dot = hsum(vdot);
        for (; j < kl; ++j) {
          const float x = pr[j];
          float dp = dpr[j];
          if (kp) {
            pdr[j] = kp[j] ? x * keep_scale : 0.0f;
            dp = kp[j] ? dp * keep_scale : 0.0f;
          } else {
            pdr[j] = x;
          }
          dpr[j] = dp;
          dot += x * dp;
        }
        // dS, the two segment sums, and the row's band of dB.
        const vf vd = bcast(dot);
        vf e0 = vf{}, e1 = vf{};
        for (j = 0; j + VL <= kl; j += VL) {
          vf x = load(pr + j) * (load(dpr + j) - vd);
          if (blk) x = load_bool(blk + j) ? zero : x;
          store(dsr + j, x);
          if (dif) {
            const vi other = load_bool(dif + j);
            e1 += other ? x : zero;
            e0 += other ? zero : x;
          }
        }
        float de0 = hsum(e0), de1 = hsum(e1);
        for (; j < kl; ++j) {
          float x = pr[j] * (dpr[j] - dot);
          if (blk && blk[j]) x = 0.0f;
          dsr[j] = x;
          if (dif) (dif[j] ? de1 : de0) += x;
        }
        de[2 * r] = de0;
        de[2 * r + 1] = de1;
        float* bandr = dbd.data() + r * wld;
        const int o = p.off(i1, i);
        std::fill(bandr, bandr + wb, 0.0f);
        std::memcpy(bandr + o, dsr, kl * sizeof(float));
      }
      gemm<true, true>(pd.data(), kld, doh, nh, dvh.data(), h, kl, h, m);         // dV += D^T dO
      gemm(ds.data(), kld, kh, nh, dqw.data(), h, m, h, kl);                       // dQw = dS K
      gemm<true, true>(ds.data(), kld, qw.data(), h, dkh.data(), h, kl, h, m);    // dK += dS^T Qw
      gemm(dbd.data(), wld, krp.data() + pa * h, h, dqr.data(), h, m, h, wb);      // dQr = dB KR
      gemm<true, true>(dbd.data(), wld, qr.data(), h, dkrp.data() + pa * h, h, wb, h, m);  // dKR += dB^T Qr
      for (int r = 0; r < m; ++r) {
        float* dqo = g.dq + p.bq(bi, i0 + r) * nh + hi * h;
        const vf d0 = bcast(de[2 * r]), d1 = bcast(de[2 * r + 1]);
        for (int d = 0; d < h; d += VL) {
          const vf a = load(dqw.data() + r * h + d), c = load(dqr.data() + r * h + d);
          store(arw + d, load(arw + d) + a);
          store(arr + d, load(arr + d) + c);
          vf t = a + c;
          if (p.diff) {
            const vf e = d0 * load(seg0 + d) + d1 * load(seg1 + d);
            t += e;
            store(ars + d, load(ars + d) + e);
            const vf y = load(qs.data() + r * h + d);
            store(as0 + d, load(as0 + d) + d0 * y);
            store(as1 + d, load(as1 + d) + d1 * y);
          }
          store(dqo + d, t * s);
        }
      }
    }
    for (int j = 0; j < kl; ++j) {
      std::memcpy(g.dk + p.bk(bi, j) * nh + hi * h, dkh.data() + static_cast<size_t>(j) * h, h * sizeof(float));
      std::memcpy(g.dv + p.bk(bi, j) * nh + hi * h, dvh.data() + static_cast<size_t>(j) * h, h * sizeof(float));
    }
  }
  for (int r = 0; r < rl; ++r)
    for (int d = 0; d < h; ++d) g.dkr[static_cast<int64_t>(r) * nh + hi * h + d] = r < rows ? dkrp[r * h + d] : 0.0f;
  for (int d = 0; d < h; ++d) {
    g.drw[hi * h + d] = arw[d] * p.s;
    g.drr[hi * h + d] = arr[d] * p.s;
    g.drs[hi * h + d] = ars[d] * p.s;
    g.dseg[hi * h + d] = as0[d];
    g.dseg[nh + hi * h + d] = as1[d];
  }
}

class RelAttentionGradOp : public TrainingOpBase {
 public:
  using TrainingOpBase::TrainingOpBase;

  void Compute(OpKernelContext* ctx) override {
    // Inputs: d_out [b, q, n, h], then XlnetRelAttentionTrain's inputs, then its prob output. Outputs: the
    // gradients of q, k, v, kr, r_w, r_r, r_s, seg_embed.
    const Tensor& dout = ctx->input(0);
    Problem p;
    OP_REQUIRES_OK(ctx, parse(ctx->input(1), ctx->input(2), ctx->input(3), ctx->input(5), ctx->input(6),
                              ctx->input(7), ctx->input(8), ctx->input(9), ctx->input(10), scale_, &p));
    const Tensor& kr = ctx->input(4);
    const Tensor& keep = ctx->input(11);
    const Tensor& prob = ctx->input(12);
    OP_REQUIRES_OK(ctx, parse_kr(kr, p));
    OP_REQUIRES_OK(ctx, parse_bnqk(keep, p, "keep", true));
    OP_REQUIRES_OK(ctx, parse_bnqk(prob, p, "prob", false));
    OP_REQUIRES(ctx, dout.shape() == ctx->input(1).shape(),
                InvalidArgument("rel_attention: d_out must be shaped like q ", ctx->input(1).shape().DebugString(),
                                ", got ", dout.shape().DebugString()));
    Tensor* outs[8];  // shaped like inputs 1..8 (q, k, v, kr, r_w, r_r, r_s, seg_embed)
    for (int o = 0; o < 8; ++o) OP_REQUIRES_OK(ctx, ctx->allocate_output(o, ctx->input(o + 1).shape(), &outs[o]));
    GradOutputs g{outs[0]->flat<float>().data(), outs[1]->flat<float>().data(), outs[2]->flat<float>().data(),
                  outs[3]->flat<float>().data(), outs[4]->flat<float>().data(), outs[5]->flat<float>().data(),
                  outs[6]->flat<float>().data(), outs[7]->flat<float>().data()};
    if (ctx->input(1).NumElements() == 0 || p.kl == 0) {  // nothing attended: every gradient is 0
      for (int o = 0; o < 8; ++o) std::fill(outs[o]->flat<float>().data(),
                                            outs[o]->flat<float>().data() + outs[o]->NumElements(), 0.0f);
      return;
    }
    // Otherwise backward_head writes every element of every output (rows of dkr past what a tile reads as 0).
    const float* krp = kr.flat<float>().data();
    const float* doutp = dout.flat<float>().data();
    const float* probp = prob.flat<float>().data();
    const bool* keepp = keep.NumElements() ? keep.flat<bool>().data() : nullptr;
    const float ks = keepp ? keep_scale_ : 1.0f;
    const int rl = kr.dim_size(0);
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    const int64_t cost = static_cast<int64_t>(p.b) * p.ql * (p.kl * 6 + TILE * 2) * p.h * 2;
    pool->ParallelFor(p.n, cost, [&](int64_t start, int64_t end) {
      for (int64_t hi = start; hi < end; ++hi) backward_head(p, hi, krp, rl, doutp, probp, keepp, ks, g);
    });
  }
};

tensorflow::Status same_as_input(tensorflow::shape_inference::InferenceContext* c, int first_output,
                                 std::initializer_list<int> inputs) {
  int o = first_output;
  for (int i : inputs) c->set_output(o++, c->input(i));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("XlnetRelAttention")
    .Input("q: float")
    .Input("k: float")
    .Input("v: float")
    .Input("pos_sin: float")
    .Input("pos_cos: float")
    .Input("pos_index: int32")
    .Input("pos_sign: float")
    .Input("r_w_bias: float")
    .Input("r_r_bias: float")
    .Input("r_s_bias: float")
    .Input("seg_embed: float")
    .Input("seg_diff: bool")
    .Input("blocked: bool")
    .Attr("scale: float")
    .Output("out: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) { return same_as_input(c, 0, {0}); })
    .Doc("XLNet relative attention (inference, float32); see xlnet_tf/accel/kernels/rel_attention.cc.");

// The training pair's shared inputs (the gradient op takes d_out first and the forward's prob last).
#define XLNET_TRAIN_INPUTS                                                                                   \
  Input("q: float").Input("k: float").Input("v: float").Input("kr: float").Input("r_w_bias: float")          \
      .Input("r_r_bias: float").Input("r_s_bias: float").Input("seg_embed: float").Input("seg_diff: bool")  \
      .Input("blocked: bool").Input("keep: bool").Attr("scale: float").Attr("keep_scale: float")

REGISTER_OP("XlnetRelAttentionTrain")
    .XLNET_TRAIN_INPUTS
    .Output("out: float")
    .Output("prob: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      auto q = c->input(0), k = c->input(1);
      c->set_output(1, c->MakeShape({c->Dim(q, 0), c->Dim(q, 2), c->Dim(q, 1), c->Dim(k, 1)}));
      return absl::OkStatus();
    })
    .Doc("XLNet relative attention, training forward (float32); see xlnet_tf/accel/kernels/rel_attention.cc.");

REGISTER_OP("XlnetRelAttentionGrad")
    .Input("d_out: float")
    .XLNET_TRAIN_INPUTS
    .Input("prob: float")
    .Output("d_q: float")
    .Output("d_k: float")
    .Output("d_v: float")
    .Output("d_kr: float")
    .Output("d_r_w_bias: float")
    .Output("d_r_r_bias: float")
    .Output("d_r_s_bias: float")
    .Output("d_seg_embed: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return same_as_input(c, 0, {1, 2, 3, 4, 5, 6, 7, 8});
    })
    .Doc("The gradient of XlnetRelAttentionTrain; see xlnet_tf/accel/kernels/rel_attention.cc.");

REGISTER_KERNEL_BUILDER(Name("XlnetRelAttention").Device(tensorflow::DEVICE_CPU), RelAttentionOp);
REGISTER_KERNEL_BUILDER(Name("XlnetRelAttentionTrain").Device(tensorflow::DEVICE_CPU), RelAttentionTrainOp);
REGISTER_KERNEL_BUILDER(Name("XlnetRelAttentionGrad").Device(tensorflow::DEVICE_CPU), RelAttentionGradOp);
