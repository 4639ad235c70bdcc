// Host side of the attention-state merges (include/flashlab/serving.h): validation, then one
// launch of kernels/serving/merge_state.cuh.
#include <cstdint>
#include <initializer_list>

#include "flashlab/serving.h"
#include "flashlab/validate.h"
#include "kernels/serving/merge_state.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

// v-like tensors: rows of 16-byte vectors (check::vector_rows), contiguous; the shape (rank) is
// checked by the caller.
void check_v(const check::Arg& a, int rank) {
  check::vector_rows(a, rank);
  check::contiguous(a);
}

// s-like tensors: fp32, contiguous, on v's device.
void check_s(const check::Arg& a, const check::Arg& v, std::initializer_list<int64_t> shape) {
  check::cuda(a);
  check::same_device(a, v);
  check::dtype_in(a, {DType::kF32});
  check::shape(a, shape);
  check::contiguous(a);
  check::aligned(a, 4);
}

void launch(const kernels::MergeStateParams& p, DType dtype, cudaStream_t stream) {
  if (p.seq == 0 || p.nheads == 0) return;
  const int64_t items = p.seq * p.nheads;
  FLASHLAB_CHECK(items / 4 + 1 <= 0x7fffffff, "merge_state: seq x nheads too large (", items, ")");
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(items, 4)));
  DTYPE_SWITCH(dtype, T, [&] { FLASHLAB_LAUNCH(kernels::merge_state_kernel<T>, grid, 128, 0, stream, p); });
}

}  // namespace

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                 const TensorView& v_out, const TensorView& s_out, cudaStream_t stream) {
  constexpr const char* op = "merge_state";
  const check::Arg Va{op, "v_a", v_a}, Sa{op, "s_a", s_a}, Vb{op, "v_b", v_b}, Sb{op, "s_b", s_b}, Vo{op, "v_out", v_out},
      So{op, "s_out", s_out};
  check_v(Va, 3);
  for (const check::Arg* v : {&Vb, &Vo}) {
    check_v(*v, 3);
    check::same_device(*v, Va);
    check::dtype_eq(*v, Va);
    check::shape_eq(*v, Va);
  }
  const int64_t seq = v_a.shape[0], nheads = v_a.shape[1];
  for (const check::Arg* s : {&Sa, &Sb, &So}) check_s(*s, Va, {seq, nheads});
  FLASHLAB_CHECK(nheads <= 0x7fffffff && v_a.shape[2] <= 0x7fffffff, op, ": argument 'v_a': expected nheads and headdim < 2^31, got ",
                 shape_str(v_a.shape));
  // Outputs: identical to an input of their kind (in place) or disjoint from everything.
  for (const check::Arg* in : {&Va, &Sa, &Vb, &Sb}) {
    check::no_overlap(Vo, *in);
    check::no_overlap(So, *in);
  }
  check::no_overlap(Vo, So);
  if (v_out.data == s_a.data || v_out.data == s_b.data || s_out.data == v_a.data || s_out.data == v_b.data ||
      v_out.data == s_out.data)
    check::fail(Vo, "outputs identical to an input of their own kind only (v_out to v_a or v_b, s_out to s_a or s_b)",
                "a v / s alias");
  kernels::MergeStateParams p{};
  p.v[0] = v_a.data, p.v[1] = v_b.data;
  p.s[0] = static_cast<const float*>(s_a.data), p.s[1] = static_cast<const float*>(s_b.data);
  p.v_query_stride = nheads * v_a.shape[2], p.s_query_stride = nheads;
  p.v_out = v_out.data, p.s_out = static_cast<float*>(s_out.data);
  p.seq = seq, p.nheads = static_cast<int>(nheads), p.headdim = static_cast<int>(v_a.shape[2]), p.num_states = 2;
  detail::DeviceGuard guard(v_a.device.index);
  launch(p, v_a.dtype, stream);
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out, const TensorView& s_out,
                  cudaStream_t stream) {
  constexpr const char* op = "merge_states";
  const check::Arg V{op, "v", v}, S{op, "s", s}, Vo{op, "v_out", v_out}, So{op, "s_out", s_out};
  check_v(V, 4);
  const int64_t seq = v.shape[0], num_states = v.shape[1], nheads = v.shape[2], d = v.shape[3];
  FLASHLAB_CHECK(num_states >= 1 && num_states <= 0x7fffffff, op, ": argument 'v': expected 1 .. 2^31 - 1 states (dim 1), got ",
                 num_states);
  FLASHLAB_CHECK(nheads <= 0x7fffffff && d <= 0x7fffffff, op, ": argument 'v': expected nheads and headdim < 2^31, got ",
                 shape_str(v.shape));
  check_v(Vo, 3);
  check::same_device(Vo, V);
  check::dtype_eq(Vo, V);
  check::shape(Vo, {seq, nheads, d});
  check_s(S, V, {seq, num_states, nheads});
  check_s(So, V, {seq, nheads});
  for (const check::Arg* out : {&Vo, &So})
    for (const check::Arg* in : {&V, &S}) check::disjoint(*out, *in);
  check::disjoint(Vo, So);
  kernels::MergeStateParams p{};
  p.v[0] = v.data, p.v[1] = nullptr;
  p.s[0] = static_cast<const float*>(s.data), p.s[1] = nullptr;
  p.v_query_stride = num_states * nheads * d, p.v_state_stride = nheads * d;
  p.s_query_stride = num_states * nheads, p.s_state_stride = nheads;
  p.v_out = v_out.data, p.s_out = static_cast<float*>(s_out.data);
  p.seq = seq, p.nheads = static_cast<int>(nheads), p.headdim = static_cast<int>(d), p.num_states = static_cast<int>(num_states);
  detail::DeviceGuard guard(v.device.index);
  launch(p, v.dtype, stream);
}

}  // namespace flashlab
