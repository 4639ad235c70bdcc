// Vector add, every rung, against the float64 reference on fresh random inputs with the output
// poisoned (NaN) before each launch.
#include <gtest/gtest.h>

#include <random>

#include "flashlab/elementwise.h"
#include "flashlab/validate.h"
#include "src/reference/reference.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

struct Case {
  DType dtype;
  int64_t n;
  int rung;
  int64_t off_a, off_b, off_out;  // element offsets from a 256-byte aligned base
  bool in_place = false;          // out is a
};

void run_case(const Case& c, std::mt19937_64& rng) {
  const int es = dtype_size(c.dtype);
  const auto a = random_tensor(c.dtype, c.n, rng), b = random_tensor(c.dtype, c.n, rng);
  const size_t bytes = static_cast<size_t>(c.n + 16) * es;
  DeviceBuffer da(bytes), db(bytes), dout(bytes);
  da.poison();
  db.poison();
  dout.poison();
  void* pa = da.at(c.off_a * es);
  void* pb = db.at(c.off_b * es);
  void* po = c.in_place ? pa : dout.at(c.off_out * es);
  upload(pa, a.bytes);
  upload(pb, b.bytes);
  vector_add(device_view(pa, c.dtype, {c.n}), device_view(pb, c.dtype, {c.n}), device_view(po, c.dtype, {c.n}),
             nullptr, c.rung);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = decode(c.dtype, download(po, static_cast<size_t>(c.n) * es));
  const auto ref = reference::vector_add(a.values, b.values);
  std::vector<double> naive(ref.size());
  double max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    naive[i] = round_to(c.dtype, static_cast<float>(a.values[i]) + static_cast<float>(b.values[i]));
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  expect_within_tolerance(got, naive, ref, unit_roundoff(c.dtype) * max_ref,
                          ::testing::Message() << dtype_name(c.dtype) << " n=" << c.n << " rung=" << c.rung
                                               << " offsets=" << c.off_a << "," << c.off_b << "," << c.off_out
                                               << (c.in_place ? " in-place" : ""));
  // Nothing outside [0, n) of out was written (the guard elements stay NaN).
  if (!c.in_place) {
    const auto after = decode(c.dtype, download(dout.at((c.off_out + c.n) * es), 16 * es - c.off_out * es));
    for (double v : after) ASSERT_TRUE(std::isnan(v)) << "write past the end, n=" << c.n;
  }
}

const int64_t kSizes[] = {1, 7, 8, 111, 500, 1024, 4097, 65536 + 3, (1 << 20) + 5, 1 << 22};

TEST(VectorAdd, AllRungsAllSizesAligned) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(1);
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t n : kSizes)
      for (int rung = 1; rung <= kVectorAddRungs; ++rung) {
        const int64_t vec = 16 / dtype_size(dt);
        if (rung == 2 && n % vec != 0) continue;  // rung 2's precondition; rejection tested below
        run_case({dt, n, rung, 0, 0, 0}, rng);
      }
}

TEST(VectorAdd, AnyAlignmentOnRungs1And3) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2);
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t n : {1, 3, 9, 100, 4099, 100003})
      for (int rung : {1, 3}) {
        for (int64_t off = 0; off < 16 / dtype_size(dt); ++off) run_case({dt, n, rung, off, off, off}, rng);
        run_case({dt, n, rung, 1, 0, 3}, rng);  // different offsets: scalar path of rung 3
        run_case({dt, n, rung, 2, 2, 2, /*in_place=*/true}, rng);
      }
}

TEST(VectorAdd, Rung2RejectsWhatItCannotDoAndLaunchesNothing) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer buf(4096);
  buf.poison();
  const auto before = download(buf.ptr, 4096);
  const int64_t launches = check::launch_count();
  auto v = [&](size_t off, int64_t n) { return device_view(buf.at(off), DType::kF32, {n}); };
  EXPECT_THROW(vector_add(v(4, 64), v(1024 + 4, 64), v(2048 + 4, 64), nullptr, 2), Error);  // misaligned
  EXPECT_THROW(vector_add(v(0, 63), v(1024, 63), v(2048, 63), nullptr, 2), Error);          // n % 4 != 0
  EXPECT_EQ(check::launch_count(), launches);
  EXPECT_EQ(download(buf.ptr, 4096), before) << "a rejected call changed memory";
}

}  // namespace
}  // namespace flashlab
