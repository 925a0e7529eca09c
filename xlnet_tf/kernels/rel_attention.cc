// XLNet's relative attention at inference as one CPU kernel (float32): for every (batch row, head) it forms
// the scores of a tile of query rows -- content (AC), position (BD, after the relative shift) and segment (EF)
// terms, the blocked mask -- normalises them and multiplies by the values, all while the tile's scores sit in
// cache. The TensorFlow graph instead writes every [b, n, q, k] score tensor to memory several times
// (AC, BD, the score cluster, the softmax) and moves the heads with four transposes; this kernel reads the
// projections in their natural [b, len, n, h] layout and writes [b, q, n, h].
//
// Same formulas as xlnet_tf/layers.py (_attend_rows): score(i, j) = (q_i + r_w) s . k_j
// + (q_i + r_r) s . kr[qlen - i + j] + (q_i + r_s) s . seg[diff(i, j)], -1e30 where blocked, softmax over j,
// times v_j; s = 1 / sqrt(d_head). Summation order differs from the graph's (outputs agree to ~1e-6).
//
// Built by `python -m xlnet_tf.kernels build` with -march=native; the vector code uses GCC vector extensions,
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
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;

// VL: floats per vector; score tiles are GEMM_ROWS x SC vectors of accumulators, output tiles PV_ROWS x PV_VECS.
#if defined(__AVX512F__)
#define XLNET_VL 16
#define XLNET_SC 4
#define XLNET_PV_ROWS 6
#define XLNET_PV_VECS 4
#else
#define XLNET_VL 8
#define XLNET_SC 2
#define XLNET_PV_ROWS 4
#define XLNET_PV_VECS 2
#endif
constexpr int VL = XLNET_VL;
constexpr int GEMM_ROWS = 6;
constexpr int SC = XLNET_SC;
constexpr int PV_ROWS = XLNET_PV_ROWS;
constexpr int PV_VECS = XLNET_PV_VECS;
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

// C[R x C VL] = A[R x kd] (row stride lda) * B[kd x C VL] (row stride ldb).
template <int R, int C>
inline void score_tile(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int kd) {
  vf acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < C; ++g) acc[r][g] = vf{};
  for (int d = 0; d < kd; ++d) {
    vf bb[C];
    for (int g = 0; g < C; ++g) bb[g] = load(b + d * ldb + g * VL);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const vf x = bcast(a[r * lda + d]);
      for (int g = 0; g < C; ++g) acc[r][g] += x * bb[g];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < C; ++g) store(c + r * ldc + g * VL, acc[r][g]);
}

// One column panel of C VL columns, every row tile (the panel of B stays in L1 meanwhile).
template <int C>
void score_panel(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m, int kd) {
  for (int i = 0; i < m; i += GEMM_ROWS) {
    const float* ai = a + i * lda;
    float* ci = c + i * ldc;
    switch (std::min(GEMM_ROWS, m - i)) {
#define XLNET_TILE(R) case R: score_tile<R, C>(ai, lda, b, ldb, ci, ldc, kd); break;
      XLNET_TILE(1) XLNET_TILE(2) XLNET_TILE(3) XLNET_TILE(4) XLNET_TILE(5) XLNET_TILE(6)
#undef XLNET_TILE
    }
  }
}

// C[m x n] = A[m x kd] * B[kd x n]; n a multiple of VL.
void score_gemm(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m, int n, int kd) {
  int j = 0;
  for (; j + SC * VL <= n; j += SC * VL) score_panel<SC>(a, lda, b + j, ldb, c + j, ldc, m, kd);
  switch ((n - j) / VL) {  // the last, narrower panel
    case 1: score_panel<1>(a, lda, b + j, ldb, c + j, ldc, m, kd); break;
    case 2: score_panel<2>(a, lda, b + j, ldb, c + j, ldc, m, kd); break;
    case 3: score_panel<3>(a, lda, b + j, ldb, c + j, ldc, m, kd); break;
  }
}

// out[R x G VL] (row stride ldo) = diag(scale) P[R x kl] (row stride ldp) * V[kl x G VL] (row stride ldv).
template <int R, int G>
inline void pv_tile(const float* p, int ldp, const float* v, int ldv, int kl, const float* scale, float* out,
                    int ldo) {
  vf acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = vf{};
#pragma GCC unroll 4
  for (int j = 0; j < kl; ++j) {
    vf vv[G];
    for (int g = 0; g < G; ++g) vv[g] = load(v + j * ldv + g * VL);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const vf x = bcast(p[r * ldp + j]);
      for (int g = 0; g < G; ++g) acc[r][g] += x * vv[g];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) store(out + r * ldo + g * VL, acc[r][g] * scale[r]);
}

template <int G>
void pv_rows(const float* p, int ldp, const float* v, int ldv, int kl, const float* scale, float* out, int ldo,
             int m) {
  for (int i = 0; i < m; i += PV_ROWS) {
    const float* pi = p + i * ldp;
    float* oi = out + i * ldo;
    switch (std::min(PV_ROWS, m - i)) {
#define XLNET_TILE(R) case R: pv_tile<R, G>(pi, ldp, v, ldv, kl, scale + i, oi, ldo); break;
      XLNET_TILE(1) XLNET_TILE(2) XLNET_TILE(3) XLNET_TILE(4)
#if XLNET_PV_ROWS > 4
      XLNET_TILE(5) XLNET_TILE(6)
#endif
#undef XLNET_TILE
    }
  }
}

// out[m x h] = diag(scale) P[m x kl] * V[kl x h]; h a multiple of VL.
void pv_gemm(const float* p, int ldp, const float* v, int ldv, int kl, const float* scale, float* out, int ldo,
             int m, int h) {
  int col = 0;
  for (; col + PV_VECS * VL <= h; col += PV_VECS * VL) pv_rows<PV_VECS>(p, ldp, v + col, ldv, kl, scale, out + col, ldo, m);
  for (; col < h; col += VL) pv_rows<1>(p, ldp, v + col, ldv, kl, scale, out + col, ldo, m);
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

class RelAttentionOp : public OpKernel {
 public:
  explicit RelAttentionOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& q = ctx->input(0);    // [b, q, n, h]
    const Tensor& k = ctx->input(1);    // [b, k, n, h]
    const Tensor& v = ctx->input(2);    // [b, k, n, h]
    const Tensor& kr = ctx->input(3);   // [r, n, h]
    const Tensor& rw = ctx->input(4);   // [n, h]
    const Tensor& rr = ctx->input(5);   // [n, h]
    const Tensor& rs = ctx->input(6);   // [n, h]
    const Tensor& seg = ctx->input(7);  // [2, n, h]
    const Tensor& diff = ctx->input(8);     // bool [b, q, k], or [0, 0, 0]: no segment term
    const Tensor& blocked = ctx->input(9);  // bool [b or 1, q, k], or [0, 0, 0]: nothing blocked
    OP_REQUIRES(ctx, q.dims() == 4 && k.dims() == 4 && v.dims() == 4 && kr.dims() == 3,
                InvalidArgument("rel_attention: q, k, v must be [b, len, n, h] and kr [r, n, h]"));
    const int b = q.dim_size(0), ql = q.dim_size(1), n = q.dim_size(2), h = q.dim_size(3);
    const int kl = k.dim_size(1), rl = kr.dim_size(0);
    OP_REQUIRES(ctx, k.dim_size(0) == b && v.shape() == k.shape() && k.dim_size(2) == n && k.dim_size(3) == h &&
                kr.dim_size(1) == n && kr.dim_size(2) == h,
                InvalidArgument("rel_attention: shapes do not agree: q ", q.shape().DebugString(), ", k ",
                                k.shape().DebugString(), ", v ", v.shape().DebugString(), ", kr ",
                                kr.shape().DebugString()));
    OP_REQUIRES(ctx, h % VL == 0, InvalidArgument("rel_attention: d_head must be a multiple of ", VL, ", got ", h));
    const bool has_seg = diff.NumElements() > 0;
    const bool has_mask = blocked.NumElements() > 0;
    OP_REQUIRES(ctx, !has_seg || (diff.dims() == 3 && diff.dim_size(0) == b && diff.dim_size(1) == ql &&
                                  diff.dim_size(2) == kl),
                InvalidArgument("rel_attention: segment diff must be [b, q, k], got ", diff.shape().DebugString()));
    OP_REQUIRES(ctx, !has_mask || (blocked.dims() == 3 && (blocked.dim_size(0) == b || blocked.dim_size(0) == 1) &&
                                   blocked.dim_size(1) == ql && blocked.dim_size(2) == kl),
                InvalidArgument("rel_attention: blocked must be [b|1, q, k], got ", blocked.shape().DebugString()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, q.shape(), &out));
    if (q.NumElements() == 0) return;

    const float* qp = q.flat<float>().data();
    const float* kp = k.flat<float>().data();
    const float* vp = v.flat<float>().data();
    const float* krp = kr.flat<float>().data();
    const float* rwp = rw.flat<float>().data();
    const float* rrp = rr.flat<float>().data();
    const float* rsp = rs.flat<float>().data();
    const float* segp = seg.flat<float>().data();
    const bool* diffp = has_seg ? diff.flat<bool>().data() : nullptr;
    const bool* blkp = has_mask ? blocked.flat<bool>().data() : nullptr;
    const int blk_b = has_mask ? blocked.dim_size(0) : 0;
    float* op = out->flat<float>().data();
    const int nh = n * h;
    const float s = scale_;

    // Widths: scores padded to whole vector pairs; the positional table spans every column a tile reads.
    const int kpad = round_up(kl, VL);
    // A tile's positional scores start at an aligned column pa <= p0 (p0 - pa < VL) and span wpad columns.
    const int wpad = round_up(kl + TILE - 1 + VL, VL);
    const int rpad = round_up(ql + wpad, VL);  // every column a tile reads: pa + wpad <= qlen + wpad
    // Row strides one vector longer than the widths: rows a power-of-two apart would share L1 sets.
    const int kld = kpad + VL, wld = wpad + VL, rld = rpad + VL;

    // KR^T of every head, zero beyond rlen: [n][h][rpad], shared by all batch rows.
    Buffer krt_all(static_cast<size_t>(n) * h * rld);
    std::fill(krt_all.data(), krt_all.data() + static_cast<size_t>(n) * h * rld, 0.0f);
    for (int hi = 0; hi < n; ++hi) {
      float* dst = krt_all.data() + static_cast<size_t>(hi) * h * rld;
      for (int p = 0; p < std::min(rl, rpad); ++p) {
        const float* src = krp + static_cast<int64_t>(p) * nh + hi * h;
        for (int d = 0; d < h; ++d) dst[d * rld + p] = src[d];
      }
    }

    auto work = [&](int64_t start, int64_t end) {
      Buffer kt(h * kld), qw(TILE * h), qr(TILE * h), sc(TILE * kld), bd(TILE * wld), ef(2 * TILE), inv(TILE);
      std::fill(kt.data(), kt.data() + h * kld, 0.0f);
      for (int64_t task = start; task < end; ++task) {
        const int bi = task / n, hi = task % n;
        // K^T of this head (the padding columns stay zero).
        transpose_rows(kp + static_cast<int64_t>(bi) * kl * nh + hi * h, nh, kl, h, kt.data(), kld);
        const float* krt = krt_all.data() + static_cast<size_t>(hi) * h * rld;
        const float* vh = vp + static_cast<int64_t>(bi) * kl * nh + hi * h;
        for (int i0 = 0; i0 < ql; i0 += TILE) {
          const int m = std::min(TILE, ql - i0), i1 = i0 + m;
          // Biased, scaled queries and the two segment scores of each row.
          const float *rwh = rwp + hi * h, *rrh = rrp + hi * h, *rsh = rsp + hi * h;
          const float *seg0 = segp + hi * h, *seg1 = segp + nh + hi * h;
          for (int r = 0; r < m; ++r) {
            const float* src = qp + (static_cast<int64_t>(bi) * ql + i0 + r) * nh + hi * h;
            vf a0 = vf{}, a1 = vf{};
            for (int d = 0; d < h; d += VL) {
              const vf x = load(src + d);
              store(qw.data() + r * h + d, (x + load(rwh + d)) * s);
              store(qr.data() + r * h + d, (x + load(rrh + d)) * s);
              if (has_seg) {
                const vf y = (x + load(rsh + d)) * s;
                a0 += y * load(seg0 + d);
                a1 += y * load(seg1 + d);
              }
            }
            ef[2 * r] = hsum(a0);
            ef[2 * r + 1] = hsum(a1);
          }
          score_gemm(qw.data(), h, kt.data(), kld, sc.data(), kld, m, kpad, h);
          // Row i reads kr[qlen - i + j]; the tile's rows read columns p0 .. p0 + kl + m - 2.
          const int p0 = ql - i1 + 1, pa = p0 / VL * VL;
          score_gemm(qr.data(), h, krt + pa, rld, bd.data(), wld, m, round_up(p0 - pa + kl + m - 1, VL), h);
          for (int r = 0; r < m; ++r) {
            const int i = i0 + r;
            inv[r] = softmax_row(sc.data() + r * kld, bd.data() + r * wld + (p0 - pa) + (i1 - 1 - i), kl,
                                 has_seg ? diffp + (static_cast<int64_t>(bi) * ql + i) * kl : nullptr,
                                 ef[2 * r], ef[2 * r + 1],
                                 has_mask ? blkp + (static_cast<int64_t>(blk_b == 1 ? 0 : bi) * ql + i) * kl
                                          : nullptr);
          }
          float* oh = op + (static_cast<int64_t>(bi) * ql + i0) * nh + hi * h;
          pv_gemm(sc.data(), kld, vh, nh, kl, inv.data(), oh, nh, m, h);
        }
      }
    };
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    const int64_t cost = static_cast<int64_t>(ql) * (kl * 2 + kl + TILE) * h * 2;
    pool->ParallelFor(static_cast<int64_t>(b) * n, cost, work);
  }

 private:
  float scale_;
};

}  // namespace

REGISTER_OP("XlnetRelAttention")
    .Input("q: float")
    .Input("k: float")
    .Input("v: float")
    .Input("kr: float")
    .Input("r_w_bias: float")
    .Input("r_r_bias: float")
    .Input("r_s_bias: float")
    .Input("seg_embed: float")
    .Input("seg_diff: bool")
    .Input("blocked: bool")
    .Attr("scale: float")
    .Output("out: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc("XLNet relative attention (inference, float32); see xlnet_tf/kernels/rel_attention.cc.");

REGISTER_KERNEL_BUILDER(Name("XlnetRelAttention").Device(tensorflow::DEVICE_CPU), RelAttentionOp);
