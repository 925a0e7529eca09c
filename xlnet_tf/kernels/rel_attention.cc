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

// The one GEMM micro-kernel (scores and P.V): C[R x G VL] = diag(scale) A[R x kd] B[kd x G VL], row strides
// lda, ldb, ldc; scale may be null (no scaling).
template <int R, int G>
inline void gemm_tile(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int kd,
                      const float* scale) {
  vf acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = vf{};
#pragma GCC unroll 4
  for (int d = 0; d < kd; ++d) {
    vf bb[G];
    for (int g = 0; g < G; ++g) bb[g] = load(b + d * ldb + g * VL);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const vf x = bcast(a[r * lda + d]);
      for (int g = 0; g < G; ++g) acc[r][g] += x * bb[g];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) store(c + r * ldc + g * VL, scale ? acc[r][g] * scale[r] : acc[r][g]);
}

// One column panel of G VL columns, every row tile (the panel of B stays in L1 meanwhile).
template <int G>
void gemm_panel(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m, int kd,
                const float* scale) {
  for (int i = 0; i < m; i += TILE_ROWS) {
    const float* ai = a + i * lda;
    float* ci = c + i * ldc;
    const float* si = scale ? scale + i : nullptr;
    switch (std::min(TILE_ROWS, m - i)) {
#define XLNET_TILE(R) case R: gemm_tile<R, G>(ai, lda, b, ldb, ci, ldc, kd, si); break;
      XLNET_TILE(1) XLNET_TILE(2) XLNET_TILE(3) XLNET_TILE(4) XLNET_TILE(5) XLNET_TILE(6)
#undef XLNET_TILE
    }
  }
}

// C[m x n] = diag(scale) A[m x kd] B[kd x n]; n a multiple of VL; scale may be null.
void gemm(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m, int n, int kd,
          const float* scale = nullptr) {
  int j = 0;
  for (; j + TILE_VECS * VL <= n; j += TILE_VECS * VL) gemm_panel<TILE_VECS>(a, lda, b + j, ldb, c + j, ldc, m, kd, scale);
  switch ((n - j) / VL) {  // the last, narrower panel
    case 1: gemm_panel<1>(a, lda, b + j, ldb, c + j, ldc, m, kd, scale); break;
    case 2: gemm_panel<2>(a, lda, b + j, ldb, c + j, ldc, m, kd, scale); break;
    case 3: gemm_panel<3>(a, lda, b + j, ldb, c + j, ldc, m, kd, scale); break;
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

class RelAttentionOp : public OpKernel {
 public:
  explicit RelAttentionOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& q = ctx->input(0);    // [b, q, n, h]
    const Tensor& k = ctx->input(1);    // [b, k, n, h]
    const Tensor& v = ctx->input(2);    // [b, k, n, h]
    // The projected positional encodings in factored form (layers.PositionalBasis): row p of KR is
    // pos_cos[index[p]] + sign[p] * pos_sin[index[p]].
    const Tensor& pos_sin = ctx->input(3);    // [R, n*h]
    const Tensor& pos_cos = ctx->input(4);    // [R, n*h]
    const Tensor& pos_index = ctx->input(5);  // int32 [r]
    const Tensor& pos_sign = ctx->input(6);   // [r]
    const Tensor& rw = ctx->input(7);   // [n, h]
    const Tensor& rr = ctx->input(8);   // [n, h]
    const Tensor& rs = ctx->input(9);   // [n, h]
    const Tensor& seg = ctx->input(10);  // [2, n, h]
    const Tensor& diff = ctx->input(11);     // bool [b, q, k], or [0, 0, 0]: no segment term
    const Tensor& blocked = ctx->input(12);  // bool [b or 1, q, k], or [0, 0, 0]: nothing blocked
    OP_REQUIRES(ctx, q.dims() == 4 && k.dims() == 4 && v.dims() == 4,
                InvalidArgument("rel_attention: q, k, v must be [b, len, n, h]"));
    const int b = q.dim_size(0), ql = q.dim_size(1), n = q.dim_size(2), h = q.dim_size(3);
    const int kl = k.dim_size(1), rl = pos_index.NumElements(), nh = n * h;
    OP_REQUIRES(ctx, k.dim_size(0) == b && v.shape() == k.shape() && k.dim_size(2) == n && k.dim_size(3) == h,
                InvalidArgument("rel_attention: shapes do not agree: q ", q.shape().DebugString(), ", k ",
                                k.shape().DebugString(), ", v ", v.shape().DebugString()));
    OP_REQUIRES(ctx, pos_sin.dims() == 2 && pos_sin.dim_size(1) == nh && pos_cos.shape() == pos_sin.shape() &&
                pos_index.dims() == 1 && pos_sign.shape() == pos_index.shape(),
                InvalidArgument("rel_attention: positional tables must be sin, cos [R, ", nh, "] and index, sign "
                                "[r], got ", pos_sin.shape().DebugString(), ", ", pos_cos.shape().DebugString(),
                                ", ", pos_index.shape().DebugString(), ", ", pos_sign.shape().DebugString()));
    const int32_t* idxp = pos_index.flat<int32_t>().data();
    const int n_rows = pos_sin.dim_size(0);
    for (int p = 0; p < rl; ++p)
      OP_REQUIRES(ctx, idxp[p] >= 0 && idxp[p] < n_rows,
                  InvalidArgument("rel_attention: positional index[", p, "] = ", idxp[p], " outside [0, ", n_rows,
                                  ")"));
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
    const float* sinp = pos_sin.flat<float>().data();
    const float* cosp = pos_cos.flat<float>().data();
    const float* signp = pos_sign.flat<float>().data();
    const float* rwp = rw.flat<float>().data();
    const float* rrp = rr.flat<float>().data();
    const float* rsp = rs.flat<float>().data();
    const float* segp = seg.flat<float>().data();
    const bool* diffp = has_seg ? diff.flat<bool>().data() : nullptr;
    const bool* blkp = has_mask ? blocked.flat<bool>().data() : nullptr;
    const int blk_b = has_mask ? blocked.dim_size(0) : 0;
    float* op = out->flat<float>().data();
    const float s = scale_;

    // Widths: scores padded to whole vectors; the positional table spans every column a tile reads.
    const int kpad = round_up(kl, VL);
    // A tile's positional scores start at an aligned column pa <= p0 (p0 - pa < VL) and span wpad columns.
    const int wpad = round_up(kl + TILE - 1 + VL, VL);
    const int rpad = round_up(ql + wpad, VL);  // every column a tile reads: pa + wpad <= qlen + wpad
    // Row strides one vector longer than the widths: rows a power-of-two apart would share L1 sets.
    const int kld = kpad + VL, wld = wpad + VL, rld = rpad + VL;

    // KR^T of every head, zero beyond rlen: [n][h][rld], shared by all batch rows; built per head in parallel.
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    const int rows = std::min(rl, rpad);
    Buffer krt_all(static_cast<size_t>(n) * h * rld);
    pool->ParallelFor(n, static_cast<int64_t>(rld) * h * 4, [&](int64_t start, int64_t end) {
      Buffer kr(static_cast<size_t>(rows) * h);
      for (int64_t hi = start; hi < end; ++hi) {
        for (int p = 0; p < rows; ++p) {
          const float* sn = sinp + static_cast<int64_t>(idxp[p]) * nh + hi * h;
          const float* cs = cosp + static_cast<int64_t>(idxp[p]) * nh + hi * h;
          const vf sg = bcast(signp[p]);
          for (int d = 0; d < h; d += VL) store(kr.data() + p * h + d, load(cs + d) + load(sn + d) * sg);
        }
        float* dst = krt_all.data() + static_cast<size_t>(hi) * h * rld;
        for (int d = 0; d < h; ++d) std::fill(dst + static_cast<int64_t>(d) * rld + rows, dst + (d + 1) * rld, 0.0f);
        transpose_rows(kr.data(), h, rows, h, dst, rld);
      }
    });

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
          gemm(qw.data(), h, kt.data(), kld, sc.data(), kld, m, kpad, h);
          // Row i reads kr[qlen - i + j]; the tile's rows read columns p0 .. p0 + kl + m - 2.
          const int p0 = ql - i1 + 1, pa = p0 / VL * VL;
          gemm(qr.data(), h, krt + pa, rld, bd.data(), wld, m, round_up(p0 - pa + kl + m - 1, VL), h);
          for (int r = 0; r < m; ++r) {
            const int i = i0 + r;
            inv[r] = softmax_row(sc.data() + r * kld, bd.data() + r * wld + (p0 - pa) + (i1 - 1 - i), kl,
                                 has_seg ? diffp + (static_cast<int64_t>(bi) * ql + i) * kl : nullptr,
                                 ef[2 * r], ef[2 * r + 1],
                                 has_mask ? blkp + (static_cast<int64_t>(blk_b == 1 ? 0 : bi) * ql + i) * kl
                                          : nullptr);
          }
          float* oh = op + (static_cast<int64_t>(bi) * ql + i0) * nh + hi * h;
          gemm(sc.data(), kld, vh, nh, oh, nh, m, h, kl, inv.data());
        }
      }
    };
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
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc("XLNet relative attention (inference, float32); see xlnet_tf/kernels/rel_attention.cc.");

REGISTER_KERNEL_BUILDER(Name("XlnetRelAttention").Device(tensorflow::DEVICE_CPU), RelAttentionOp);
