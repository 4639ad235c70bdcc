// silu_and_mul, gelu_and_mul, gelu_tanh_and_mul: every rung x activation x dtype against the
// float64 reference on fresh random inputs, outputs poisoned (NaN) before each launch, input
// row padding poisoned too (a read outside a row's 2d elements turns into NaN).
// Tolerance (tests/common/test_utils.h): error <= 2 x the error of the naive computation (the
// same fp32 formula on the host from the rounded inputs, rounded once to the dtype) + a rounding
// floor of one unit roundoff of the dtype x max |ref| (the output's rounding) + 2 fp32 unit
// roundoffs x max |gate x up|. The second term is the fp32 transcendental: CUDA's __expf, erff
// and tanhf are within 2 ulps where the host's libm is within 1, and 1 + erf / 1 + tanh turn an
// absolute error of the function into one of |gate x up| scale (|act(x)| <= |x| for all three).
// It only matters for fp32 cases of a few elements, where the naive error of one sample can be
// near 0; for 16-bit dtypes it is 2^15 (bf16) or 2^12 (fp16) times smaller than the first term.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "flashlab/activation.h"
#include "flashlab/validate.h"
#include "src/reference/activation.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

using ActFn = void (*)(const TensorView&, const TensorView&, cudaStream_t, int);

// The naive fp32 activations (host libm in float).
float silu_f32(float x) { return x / (1.f + std::exp(-x)); }
float gelu_f32(float x) { return 0.5f * x * (1.f + std::erf(x * 0.70710678f)); }
float gelu_tanh_f32(float x) { return 0.5f * x * (1.f + std::tanh(0.79788456f * x * (1.f + 0.044715f * x * x))); }

struct Op {
  const char* name;
  ActFn fn;
  reference::Act act;
  float (*naive)(float);
};
const Op kOps[] = {{"silu_and_mul", silu_and_mul, reference::Act::kSilu, silu_f32},
                   {"gelu_and_mul", gelu_and_mul, reference::Act::kGelu, gelu_f32},
                   {"gelu_tanh_and_mul", gelu_tanh_and_mul, reference::Act::kGeluTanh, gelu_tanh_f32}};
const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

struct Case {
  int64_t rows, d;
  int64_t row_stride = 0;          // input elements between rows; 0: 2d (contiguous)
  int64_t in_off = 0, out_off = 0;  // element offsets from a 256-byte aligned base
  bool three_dims = false;          // input [rows / 3, 3, 2d], out [rows / 3, 3, d]
};

// Values (exactly representable in dt) -> storage bytes.
void run_case(const Op& op, DType dt, int rung, const Case& c, const HostTensor& x) {
  const int es = dtype_size(dt);
  const int64_t two_d = 2 * c.d, stride = c.row_stride ? c.row_stride : two_d;
  constexpr int64_t kGuard = 16;  // poisoned elements around the output
  DeviceBuffer din(static_cast<size_t>(c.in_off + (c.rows - 1) * stride + two_d + kGuard) * es);
  DeviceBuffer dout(static_cast<size_t>(c.out_off + c.rows * c.d + kGuard) * es);
  din.poison();
  dout.poison();
  char* in = din.at(c.in_off * es);
  char* out = dout.at(c.out_off * es);
  if (stride == two_d) {
    upload(in, x.bytes);
  } else {
    for (int64_t r = 0; r < c.rows; ++r)
      FLASHLAB_CUDA_CHECK(cudaMemcpy(in + r * stride * es, x.bytes.data() + r * two_d * es, two_d * es,
                                     cudaMemcpyHostToDevice));
  }
  const Device gpu{DeviceType::kCUDA, 0};
  const TensorView iv = c.three_dims ? TensorView(in, dt, {c.rows / 3, 3, two_d}, {3 * stride, stride, 1}, gpu)
                                     : TensorView(in, dt, {c.rows, two_d}, {stride, 1}, gpu);
  const TensorView ov = c.three_dims ? TensorView(out, dt, {c.rows / 3, 3, c.d}, gpu) : TensorView(out, dt, {c.rows, c.d}, gpu);
  op.fn(iv, ov, nullptr, rung);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = decode(dt, download(out, static_cast<size_t>(c.rows * c.d) * es));

  const auto ref = reference::act_and_mul(op.act, x.values, c.rows, c.d);
  std::vector<double> naive(ref.size());
  double max_ref = 0, max_gu = 0;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < c.d; ++i) {
      const float g = static_cast<float>(x.values[r * two_d + i]), u = static_cast<float>(x.values[r * two_d + c.d + i]);
      naive[r * c.d + i] = round_to(dt, op.naive(g) * u);
      max_ref = std::max(max_ref, std::fabs(ref[r * c.d + i]));
      max_gu = std::max(max_gu, std::fabs(static_cast<double>(g) * u));
    }
  const auto what = ::testing::Message() << op.name << " " << dtype_name(dt) << " rung " << rung << " rows " << c.rows
                                         << " d " << c.d << " row stride " << stride << " offsets " << c.in_off << ","
                                         << c.out_off << (c.three_dims ? " 3-dim" : "");
  expect_within_tolerance(got, naive, ref, unit_roundoff(dt) * max_ref + 2 * unit_roundoff(DType::kF32) * max_gu, what);
  // Nothing outside out's rows * d elements was written.
  const auto before = decode(dt, download(dout.ptr, static_cast<size_t>(c.out_off) * es));
  const auto after = decode(dt, download(out + c.rows * c.d * es, kGuard * es));
  for (double v : before) ASSERT_TRUE(std::isnan(v)) << what << ": write before the start";
  for (double v : after) ASSERT_TRUE(std::isnan(v)) << what << ": write past the end";
}

// Gate and up in [-6, 6]: both tails of every activation and products up to 36 (fine for fp16).
void run_all(const Case& c, std::mt19937_64& rng) {
  for (DType dt : kDtypes) {
    const auto x = random_tensor(dt, c.rows * 2 * c.d, rng, -6.0, 6.0);
    for (const Op& op : kOps)
      for (int rung = 1; rung <= kActivationRungs; ++rung) run_case(op, dt, rung, c, x);
  }
}

TEST(Activation, AllRungsOpsDtypesSizes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(1);
  for (int64_t rows : {1, 7, 99})
    for (int64_t d : {1, 7, 111, 500, 4097, 8192}) run_all({rows, d}, rng);
  for (int64_t d : {1, 7, 111}) run_all({16384, d}, rng);  // many short rows
}

TEST(Activation, StridedRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2);
  for (int64_t d : {7, 500, 4096})
    for (int64_t extra : {1, 8, 13, 1000}) {
      run_all({5, d, 2 * d + extra}, rng);
      run_all({66, d, 2 * d + extra, 0, 0, /*three_dims=*/true}, rng);
    }
  run_all({33, 4096, 0, 0, 0, /*three_dims=*/true}, rng);  // contiguous 3-dim
}

TEST(Activation, MisalignedStarts) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(3);
  for (int64_t d : {8, 111, 4096, 4097})
    for (int64_t off = 1; off < 8; off += 2) {
      run_all({9, d, 0, off, off}, rng);      // same offset: vector body + scalar head/tail
      run_all({9, d, 0, off, 0}, rng);        // different offsets: scalar rows on rung 2
      run_all({9, d, 0, 0, off}, rng);
      run_all({9, d, 2 * d + off, off, off}, rng);  // the offset changes from row to row
    }
}

TEST(Activation, ExtremeInputs) {
  SKIP_WITHOUT_GPU();
  // Far tails (exp overflow in silu, erf/tanh saturation), zeros and tiny values.
  const std::vector<double> gates = {-100, -30, -17.5, -9, -1e-3, -0.0, 0.0, 1e-6, 3e-3, 9, 17.5, 30, 100, 0.5, -0.5, 2};
  const int64_t d = static_cast<int64_t>(gates.size());
  std::vector<double> values;
  for (int r = 0; r < 3; ++r) {
    values.insert(values.end(), gates.begin(), gates.end());
    for (int64_t i = 0; i < d; ++i) values.push_back(r == 0 ? 1.0 : r == 1 ? -3.0 : 0.25 * (i + 1));
  }
  for (DType dt : kDtypes) {
    const auto x = make_tensor(dt, values);
    for (const Op& op : kOps)
      for (int rung = 1; rung <= kActivationRungs; ++rung) run_case(op, dt, rung, {3, d}, x);
  }
}

TEST(Activation, RejectedCallLaunchesNothingAndWritesNothing) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer buf(4096);
  buf.poison();
  const auto before = download(buf.ptr, 4096);
  const int64_t launches = check::launch_count();
  const Device gpu{DeviceType::kCUDA, 0};
  EXPECT_THROW(silu_and_mul(TensorView(buf.at(1), DType::kBF16, {4, 16}, gpu), TensorView(buf.at(1024), DType::kBF16, {4, 8}, gpu)),
               Error);  // input not element-aligned
  EXPECT_THROW(gelu_and_mul(TensorView(buf.ptr, DType::kF32, {4, 15}, gpu), TensorView(buf.at(1024), DType::kF32, {4, 7}, gpu)),
               Error);  // odd last dim
  EXPECT_THROW(gelu_tanh_and_mul(TensorView(buf.ptr, DType::kF32, {4, 16}, gpu), TensorView(buf.at(32), DType::kF32, {4, 8}, gpu)),
               Error);  // out overlaps input
  EXPECT_EQ(check::launch_count(), launches);
  EXPECT_EQ(download(buf.ptr, 4096), before) << "a rejected call changed memory";
}

}  // namespace
}  // namespace flashlab
