// Host side of the GEMM ladder: validation, then dispatch to a rung's launcher.
#include <algorithm>
#include <string>
#include <tuple>

#include "flashlab/gemm.h"
#include "flashlab/validate.h"
#include "kernels/gemm/01_naive.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"
#include "src/gemm_launch.h"

namespace flashlab {

namespace detail {

void launch_gemm_naive(const GemmParams& p, DType dtype, cudaStream_t stream) {
  const dim3 block(kernels::kGemmNaiveBlock, kernels::kGemmNaiveBlock);
  constexpr int64_t kMaxGridY = 65535;  // the kernel loops over columns past it
  const dim3 grid(static_cast<unsigned>(ceil_div(p.M, block.x)),
                  static_cast<unsigned>(std::min<int64_t>(ceil_div(p.N, block.y), kMaxGridY)));
  DTYPE_SWITCH(dtype, T, [&] { FLASHLAB_LAUNCH(kernels::gemm_naive_kernel<T>, grid, block, 0, stream, p); });
}

}  // namespace detail

namespace {

enum class Major { kRow, kCol };

// A 2-D operand's storage: row-major (unit stride in dim 1, leading dim stride[0] >= shape[1])
// or column-major (unit stride in dim 0, stride[1] >= shape[0]). A dim of size 1 has no stride
// to honour. Returns the major order and the leading dim.
Major operand_major(const check::Arg& a, int64_t* ld) {
  const TensorView& t = a.t;
  const int64_t r = t.shape[0], c = t.shape[1], s0 = t.strides[0], s1 = t.strides[1];
  if ((c == 1 || s1 == 1) && (r == 1 || s0 >= c)) {
    *ld = r == 1 ? c : s0;
    return Major::kRow;
  }
  if ((r == 1 || s0 == 1) && (c == 1 || s1 >= r)) {
    *ld = c == 1 ? r : s1;
    return Major::kCol;
  }
  check::fail(a, "row-major (strides (>= cols, 1)) or column-major (strides (1, >= rows))",
              detail::concat("strides ", shape_str(t.strides), " for shape ", shape_str(t.shape)));
}

}  // namespace

bool gemm_rung_supports(int rung, DType dtype) {
  const bool half = dtype == DType::kF16 || dtype == DType::kBF16;
  if (rung == 1) return dtype == DType::kF32 || half;
  if (rung >= 2 && rung <= 6) return dtype == DType::kF32;
  if (rung >= 7 && rung <= kGemmRungs) return half;
  return false;
}

namespace {

// Every check of gemm() for `rung`; throws flashlab::Error on the first that fails, else returns
// the kernel parameters. Leaves the current device as it found it.
GemmParams validated_params(const TensorView& a, const TensorView& b, const TensorView& c, int rung,
                            const GemmEpilogue& epilogue) {
  constexpr const char* op = "gemm";
  const check::Arg A{op, "a", a}, B{op, "b", b}, C{op, "c", c};
  check::rung(op, rung, kGemmRungs);
  for (const check::Arg* x : {&A, &B, &C}) {
    check::cuda(*x);
    check::ndim(*x, 2);
    check::nonempty(*x);
  }
  check::same_device(B, A);
  check::same_device(C, A);
  check::dtype_in(A, {DType::kF32, DType::kF16, DType::kBF16});
  check::dtype_eq(B, A);
  check::dtype_eq(C, A);
  if (!gemm_rung_supports(rung, a.dtype))
    check::fail(A, detail::concat(rung >= 2 && rung <= 6 ? "dtype fp32" : "dtype fp16 or bf16", " for rung ", rung),
                dtype_name(a.dtype));
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  if (b.shape[0] != K)
    check::fail(B, detail::concat("shape (", K, ", N) (rows = a's cols)"), shape_str(b.shape));
  if (c.shape[0] != M || c.shape[1] != N)
    check::fail(C, detail::concat("shape (", M, ", ", N, ")"), shape_str(c.shape));
  constexpr int64_t kMaxDim = 0x7fffffff;
  for (const check::Arg* x : {&A, &B})
    for (int64_t d : x->t.shape)
      if (d > kMaxDim) check::fail(*x, "dims < 2^31", shape_str(x->t.shape));
  int64_t lda = 0, ldb = 0, ldc = 0;
  const Major ma = operand_major(A, &lda), mb = operand_major(B, &ldb);
  if (operand_major(C, &ldc) != Major::kRow)
    check::fail(C, "row-major (strides (>= N, 1))", detail::concat("strides ", shape_str(c.strides)));
  const bool nn = ma == Major::kRow && mb == Major::kRow;
  if (ma == Major::kCol && mb == Major::kCol)
    check::fail(A, "layout NN, NT or TN (a and b not both column-major)", "a and b both column-major");
  if (!nn && rung >= 2 && rung <= 8)
    check::fail(A, detail::concat("row-major a and b (layout NN) for rung ", rung, " (rungs 1 and 9 take NT, TN)"),
                ma == Major::kCol ? "column-major a" : "column-major b");
  if (epilogue.bias) {
    const check::Arg Bias{op, "bias", *epilogue.bias};
    check::row_vector(Bias, C);  // CUDA, C's device and dtype, shape (N,), contiguous, aligned
    check::no_overlap(C, Bias);
    if (epilogue.bias->data == c.data) check::fail(Bias, "memory disjoint from 'c'", "c's data pointer");
  }
  for (const check::Arg* x : {&A, &B, &C}) check::aligned(*x, dtype_size(x->t.dtype));
  if (rung == 9) {
    constexpr int64_t kTma = 16;
    for (const check::Arg* x : {&A, &B, &C}) check::aligned(*x, kTma);
    const int64_t es = dtype_size(a.dtype);
    // A single stored row has no leading dim to honour (the launcher pads the TMA stride).
    const int64_t rows_a = ma == Major::kRow ? M : K, rows_b = mb == Major::kRow ? K : N;
    for (auto [arg, ld, rows] : {std::tuple<const check::Arg*, int64_t, int64_t>{&A, lda, rows_a},
                                 {&B, ldb, rows_b},
                                 {&C, ldc, M}})
      if (rows > 1 && ld * es % kTma != 0)
        check::fail(*arg, "a leading dim of a multiple of 16 bytes for rung 9 (TMA)",
                    detail::concat("leading dim ", ld, " x ", es, " bytes"));
  }
  check::no_overlap(C, A);
  check::no_overlap(C, B);
  if (c.data == a.data || c.data == b.data) check::fail(C, "memory disjoint from 'a' and 'b'", "a shared data pointer");

  if (rung == 9) {  // the kernels are built for sm_90a only
    detail::DeviceGuard guard(a.device.index);
    if (detail::cc_major() != 9)
      check::fail(A, "a device of compute capability 9.x (sm_90a: TMA, wgmma) for rung 9",
                  detail::concat("compute capability ", detail::cc_major(), ".x"));
  }
  GemmParams p{};
  p.a = a.data;
  p.b = b.data;
  p.c = c.data;
  p.bias = epilogue.bias ? epilogue.bias->data : nullptr;
  p.M = static_cast<int>(M);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.a_row = ma == Major::kRow ? lda : 1;
  p.a_col = ma == Major::kRow ? 1 : lda;
  p.b_row = mb == Major::kRow ? ldb : 1;
  p.b_col = mb == Major::kRow ? 1 : ldb;
  p.ldc = ldc;
  p.alpha = epilogue.alpha;
  p.beta = epilogue.beta;
  return p;
}

}  // namespace

int gemm_best_rung(const TensorView& a, const TensorView& b, const TensorView& c, const GemmEpilogue& epilogue) {
  int top = kGemmRungs;  // a dtype no rung takes: the top rung, whose validation names it
  for (int rung = kGemmRungs; rung >= 1; --rung) {
    if (!gemm_rung_supports(rung, a.dtype)) continue;
    if (top == kGemmRungs) top = rung;
    try {
      validated_params(a, b, c, rung, epilogue);
      return rung;
    } catch (const Error&) {
      // this rung does not take these arguments (layout, alignment, device): try the next
    }
  }
  return top;
}

void gemm(const TensorView& a, const TensorView& b, const TensorView& c, cudaStream_t stream, int rung,
          const GemmEpilogue& epilogue) {
  const GemmParams p = validated_params(a, b, c, rung, epilogue);
  detail::DeviceGuard guard(a.device.index);
  if (rung == 1) return detail::launch_gemm_naive(p, a.dtype, stream);
  if (rung <= 6) return detail::launch_gemm_fp32(p, rung, stream);
  if (rung <= 8) return detail::launch_gemm_tensor_core(p, a.dtype, rung, stream);
  detail::launch_gemm_hopper(p, a.dtype, stream);
}

}  // namespace flashlab
