// Host side of the RoPE family: validation, then dispatch to a rung.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "flashlab/rope.h"
#include "flashlab/validate.h"
#include "kernels/rope/01_scalar.cuh"
#include "kernels/rope/02_vec16.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

using namespace kernels;

// Rung 2's preconditions (kernels/rope/02_vec16.cuh).
template <typename T>
bool vec16_ok(const RopeParams& p, bool interleave) {
  constexpr int kN = Vec<T>::kN;
  auto ptr_ok = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kVecBytes == 0; };
  const int64_t strides[] = {p.q_stride_n, p.q_stride_h, p.k_stride_n, p.k_stride_h,
                             p.q_out_stride_n, p.q_out_stride_h, p.k_out_stride_n, p.k_out_stride_h};
  const bool strides_ok = std::all_of(std::begin(strides), std::end(strides), [](int64_t s) { return s % kN == 0; });
  const int64_t units = static_cast<int64_t>(p.num_q_heads + p.num_k_heads) * p.head_dim;
  return p.head_dim % kN == 0 && p.rotary_dim % (interleave ? kN : 2 * kN) == 0 &&
         p.rotary_dim <= kRopeVecMaxRotaryDim && strides_ok && ptr_ok(p.q) && ptr_ok(p.k) && ptr_ok(p.q_out) &&
         ptr_ok(p.k_out) && units <= 0x7fffffff;
}

template <typename T, typename IdType, bool kInterleave>
void launch_rope(const RopeParams& p, cudaStream_t stream, int rung) {
  if (rung == 1 || !vec16_ok<T>(p, kInterleave)) {
    const int64_t units = p.rotary_dim / 2 + (p.copy_tail ? p.head_dim - p.rotary_dim : 0);
    const int64_t total = p.nnz * (p.num_q_heads + p.num_k_heads) * units;
    const int grid = static_cast<int>(std::min<int64_t>(detail::ceil_div(total, kRopeScalarThreads),
                                                        detail::resident_blocks(
                                                            reinterpret_cast<const void*>(
                                                                rope_scalar_kernel<T, IdType, kInterleave>),
                                                            kRopeScalarThreads)));
    FLASHLAB_LAUNCH((rope_scalar_kernel<T, IdType, kInterleave>), grid, kRopeScalarThreads, 0, stream, p);
  } else {
    FLASHLAB_LAUNCH((rope_vec16_kernel<T, IdType, kInterleave>), static_cast<int>(p.nnz), kRopeVecThreads, 0, stream,
                    p);
  }
}

// Stride of dim d, or the contiguous one when the dim has extent 1 (its stride is arbitrary).
int64_t stride_of(const TensorView& t, int d) {
  if (t.shape[d] > 1) return t.strides[d];
  int64_t s = 1;
  for (int i = d + 1; i < t.ndim(); ++i) s *= t.shape[i];
  return s;
}

// An output's (token, head) grid must not map two heads onto overlapping memory: with the two
// outer dims ordered by stride, the inner must step over a whole head and the outer over all of
// the inner (covers [nnz, heads, d] and head-major [heads, nnz, d] transposed views).
void check_no_self_overlap(const check::Arg& a) {
  const TensorView& t = a.t;
  struct Dim { int64_t n, s; };
  Dim d0{t.shape[0], t.strides[0]}, d1{t.shape[1], t.strides[1]};
  if (d0.n == 1) d0.s = 0;
  if (d1.n == 1) d1.s = 0;
  if (d0.s > d1.s) std::swap(d0, d1);  // d0: the smaller stride
  const bool ok = (d0.n == 1 || d0.s >= t.shape[2]) && (d1.n == 1 || d1.s >= (d0.n == 1 ? t.shape[2] : d0.n * d0.s));
  if (!ok)
    check::fail(a, "token and head strides that keep every head disjoint",
                detail::concat("strides ", shape_str(t.strides), " for shape ", shape_str(t.shape)));
}

void check_qk(const char* op, const check::Arg& Q, const check::Arg& K) {
  check::cuda(Q);
  check::dtype_in(Q, {DType::kF32, DType::kF16, DType::kBF16});
  check::ndim(Q, 3);
  check::nonempty(Q);
  check::last_dim_contiguous(Q);
  check::aligned(Q, dtype_size(Q.t.dtype));
  FLASHLAB_CHECK(Q.t.shape[0] <= 0x7fffffff, op, ": argument 'q': expected at most 2^31 - 1 tokens, got ",
                 Q.t.shape[0]);
  FLASHLAB_CHECK(Q.t.shape[1] <= (1 << 20), op, ": argument 'q': expected at most 2^20 heads, got ", Q.t.shape[1]);
  FLASHLAB_CHECK(Q.t.shape[2] <= (1 << 20), op, ": argument 'q': expected head_dim at most 2^20, got ",
                 Q.t.shape[2]);
  check::cuda(K);
  check::same_device(K, Q);
  check::dtype_eq(K, Q);
  check::ndim(K, 3);
  check::nonempty(K);
  check::last_dim_contiguous(K);
  check::aligned(K, dtype_size(K.t.dtype));
  FLASHLAB_CHECK(K.t.shape[0] == Q.t.shape[0], op, ": argument 'k': expected nnz ", Q.t.shape[0],
                 " (same as 'q'), got ", K.t.shape[0]);
  FLASHLAB_CHECK(K.t.shape[2] == Q.t.shape[2], op, ": argument 'k': expected head_dim ", Q.t.shape[2],
                 " (same as 'q'), got ", K.t.shape[2]);
  FLASHLAB_CHECK(K.t.shape[1] <= (1 << 20), op, ": argument 'k': expected at most 2^20 heads, got ", K.t.shape[1]);
}

void check_out(const check::Arg& O, const check::Arg& in) {
  check::cuda(O);
  check::same_device(O, in);
  check::dtype_eq(O, in);
  check::shape_eq(O, in);
  check::last_dim_contiguous(O);
  check::aligned(O, dtype_size(O.t.dtype));
  check_no_self_overlap(O);
  if (O.t.data == in.t.data && (stride_of(O.t, 0) != stride_of(in.t, 0) || stride_of(O.t, 1) != stride_of(in.t, 1)))
    check::fail(O, detail::concat("the strides of '", in.name, "' when it is '", in.name, "' (in place)"),
                detail::concat("strides ", shape_str(O.t.strides), " vs ", shape_str(in.t.strides)));
}

void check_pos_ids(const check::Arg& P, const check::Arg& Q) {
  check::cuda(P);
  check::same_device(P, Q);
  check::dtype_in(P, {DType::kI32, DType::kI64});
  check::shape(P, {Q.t.shape[0]});
  check::contiguous(P);
  check::aligned(P, dtype_size(P.t.dtype));
}

void check_rotary_dim(const char* op, int rotary_dim, int64_t head_dim) {
  FLASHLAB_CHECK(rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= head_dim, op,
                 ": argument 'rotary_dim': expected an even value in 2..head_dim (", head_dim, "), got ",
                 rotary_dim);
}

// Every pair of the four tensors disjoint, except an output identical to its own input.
void check_overlaps(const check::Arg& Q, const check::Arg& K, const check::Arg& QO, const check::Arg& KO) {
  check::no_overlap(QO, Q);
  check::no_overlap(KO, K);
  // q and k may be token-interleaved slices of one fused qkv (check::disjoint lets them through).
  check::disjoint(QO, K);
  check::disjoint(KO, Q);
  check::disjoint(QO, KO);
}

RopeParams make_params(const TensorView& q, const TensorView& k, const TensorView& q_out, const TensorView& k_out,
                       const TensorView& pos_ids, int rotary_dim) {
  RopeParams p{};
  p.q = q.data;
  p.k = k.data;
  p.q_out = q_out.data;
  p.k_out = k_out.data;
  p.pos_ids = pos_ids.data;
  p.nnz = q.shape[0];
  p.num_q_heads = static_cast<int>(q.shape[1]);
  p.num_k_heads = static_cast<int>(k.shape[1]);
  p.head_dim = static_cast<int>(q.shape[2]);
  p.rotary_dim = rotary_dim;
  p.q_stride_n = stride_of(q, 0);
  p.q_stride_h = stride_of(q, 1);
  p.k_stride_n = stride_of(k, 0);
  p.k_stride_h = stride_of(k, 1);
  p.q_out_stride_n = stride_of(q_out, 0);
  p.q_out_stride_h = stride_of(q_out, 1);
  p.k_out_stride_n = stride_of(k_out, 0);
  p.k_out_stride_h = stride_of(k_out, 1);
  p.copy_tail = rotary_dim < p.head_dim && !(q_out.data == q.data && k_out.data == k.data);
  return p;
}

void dispatch(const RopeParams& p, DType dt, DType id_dt, bool interleave, cudaStream_t stream, int rung) {
  DTYPE_SWITCH(dt, T, [&] {
    BOOL_SWITCH(id_dt == DType::kI64, kI64, [&] {
      using IdType = std::conditional_t<kI64, int64_t, int32_t>;
      BOOL_SWITCH(interleave, kInterleave, [&] { launch_rope<T, IdType, kInterleave>(p, stream, rung); });
    });
  });
}

// The checks both RoPE entries share: rung, q/k, outputs, overlaps, pos_ids.
void check_rope_args(const char* op, int rung, const check::Arg& Q, const check::Arg& K, const check::Arg& QO,
                     const check::Arg& KO, const check::Arg& P) {
  check::rung(op, rung, kRopeRungs);
  check_qk(op, Q, K);
  check_out(QO, Q);
  check_out(KO, K);
  check_overlaps(Q, K, QO, KO);
  check_pos_ids(P, Q);
}

}  // namespace

void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_out, const TensorView& k_out,
                        const TensorView& pos_ids, const RopeOptions& opt, cudaStream_t stream, int rung) {
  constexpr const char* op = "apply_rope_pos_ids";
  const check::Arg Q{op, "q", q}, K{op, "k", k}, QO{op, "q_out", q_out}, KO{op, "k_out", k_out},
      P{op, "pos_ids", pos_ids};
  check_rope_args(op, rung, Q, K, QO, KO, P);
  const int rotary_dim = opt.rotary_dim == 0 ? static_cast<int>(q.shape[2]) : opt.rotary_dim;
  check_rotary_dim(op, rotary_dim, q.shape[2]);
  auto positive = [&](const char* name, double v) {
    FLASHLAB_CHECK(std::isfinite(v) && v > 0, op, ": argument '", name, "': expected a finite value > 0, got ", v);
  };
  positive("rope_theta", opt.rope_theta);
  positive("rope_scale", opt.rope_scale);
  if (opt.llama31) {
    FLASHLAB_CHECK(opt.rope_scale == 1.f, op,
                   ": argument 'rope_scale': expected 1 with llama31 (its scale is llama31_factor), got ",
                   opt.rope_scale);
    positive("llama31_factor", opt.llama31_factor);
    positive("low_freq_factor", opt.low_freq_factor);
    FLASHLAB_CHECK(std::isfinite(opt.high_freq_factor) && opt.high_freq_factor > opt.low_freq_factor, op,
                   ": argument 'high_freq_factor': expected a finite value > low_freq_factor (", opt.low_freq_factor,
                   "), got ", opt.high_freq_factor);
    FLASHLAB_CHECK(opt.old_context_len > 0, op, ": argument 'old_context_len': expected a value > 0, got ",
                   opt.old_context_len);
  }
  detail::DeviceGuard guard(q.device.index);
  RopeParams p = make_params(q, k, q_out, k_out, pos_ids, rotary_dim);
  p.freq = RopeFreq{opt.rope_theta, opt.rope_scale, opt.llama31, opt.llama31_factor,
                    opt.low_freq_factor, opt.high_freq_factor, static_cast<double>(opt.old_context_len)};
  dispatch(p, q.dtype, pos_ids.dtype, opt.interleave, stream, rung);
}

void apply_rope_with_cos_sin_cache(const TensorView& q, const TensorView& k, const TensorView& q_out,
                                   const TensorView& k_out, const TensorView& pos_ids,
                                   const TensorView& cos_sin_cache, bool interleave, cudaStream_t stream, int rung) {
  constexpr const char* op = "apply_rope_with_cos_sin_cache";
  const check::Arg Q{op, "q", q}, K{op, "k", k}, QO{op, "q_out", q_out}, KO{op, "k_out", k_out},
      P{op, "pos_ids", pos_ids}, C{op, "cos_sin_cache", cos_sin_cache};
  check_rope_args(op, rung, Q, K, QO, KO, P);
  check::cuda(C);
  check::same_device(C, Q);
  check::dtype_in(C, {DType::kF32});
  check::ndim(C, 2);
  check::nonempty(C);
  check::contiguous(C);
  check::aligned(C, 4);
  FLASHLAB_CHECK(C.t.shape[1] % 2 == 0 && C.t.shape[1] <= q.shape[2], op,
                 ": argument 'cos_sin_cache': expected an even rotary_dim (second dim) <= head_dim (", q.shape[2],
                 "), got ", C.t.shape[1]);
  check::no_overlap(QO, C);
  check::no_overlap(KO, C);
  detail::DeviceGuard guard(q.device.index);
  RopeParams p = make_params(q, k, q_out, k_out, pos_ids, static_cast<int>(cos_sin_cache.shape[1]));
  p.cos_sin_cache = static_cast<const float*>(cos_sin_cache.data);
  dispatch(p, q.dtype, pos_ids.dtype, interleave, stream, rung);
}

TensorView split_heads(const TensorView& t, int64_t head_size, const char* op, const char* name) {
  const check::Arg A{op, name, t};
  check::ndim(A, 2);
  FLASHLAB_CHECK(head_size >= 1 && t.shape[1] % head_size == 0 && t.shape[1] > 0, op, ": argument '", name,
                 "': expected a last dim that is a positive multiple of head_size (", head_size, "), got ",
                 shape_str(t.shape));
  check::last_dim_contiguous(A);
  return TensorView(t.data, t.dtype, {t.shape[0], t.shape[1] / head_size, head_size},
                    {t.strides[0], head_size, 1}, t.device);
}

}  // namespace flashlab
