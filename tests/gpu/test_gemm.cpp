// gemm (include/flashlab/gemm.h): every rung x every dtype it takes, against the float64 reference
// on fresh random inputs (values exactly representable in the dtype). C is poisoned with NaN
// before each launch (with beta != 0 only its (M, N) elements hold the input C), and so are C's
// padding columns (ldc > N), the elements before C (offset views) and a guard after its last row:
// after the launch every element of the view must be written and every other byte unchanged.
// The padding of A and B (lda > K, ...) and a guard after them are NaN too, so a read outside
// the views shows up as NaN in the output. Covered: sizes 1, 17, 127, 129, 1000, 4096 in each
// of M, N, K (the other two 129 and 127: partial tiles in M and N, and K mostly not a multiple
// of any k-tile), one past tile edges, squares up to 1024, grids of many tiles, leading
// dims equal to the row length, padded by 8 and odd (16-byte rows broken), pointers off 16-byte
// alignment, alpha/beta/bias, and the layouts NT and TN (column-major views of transposed
// storage) where the rung takes them. A rung that does not take a case (dtype, layout, rung 9's
// 16-byte rules) must reject it without launching.
//
// Tolerance (DESIGN.md, tests/common/test_utils.h): max |got - ref| <= 2 x the error of the
// same-dtype naive rung + a rounding floor. The naive computation is rung 1 on the same inputs,
// dtype and layout (one fp32 dot product per output in k order, the epilogue in fp32, one
// rounding); rung 1 itself is held against the same computation done on the host (sequential
// fp32 adds). Floor: one unit roundoff of the output dtype x max |ref| (the final rounding) +
// 4 fp32 unit roundoffs x max over outputs of (|alpha| sum_k |a b| + |beta c| + |bias|): fused
// multiply-adds and another summation order (tiles, tensor-core accumulation) change the fp32
// rounding by a few units of that size even where the naive error of one case is near 0 (K = 1).
// Rung 9 needs sm_90: on older devices it is left out, and a test checks that it is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "flashlab/gemm.h"
#include "flashlab/validate.h"
#include "src/reference/gemm.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

constexpr int kHopperRung = 9;  // TMA + wgmma: sm_90 only, 16-byte aligned pointers and leading dims
static_assert(kGemmRungs == kHopperRung, "the rung list of include/flashlab/gemm.h changed: update this test");
constexpr int64_t kGuard = 64;  // poisoned elements after each buffer's last row

const DType kAllDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

enum class Layout { kNN, kNT, kTN };  // A row/B row, A row/B col (B = w.t()), A col/B row
const char* layout_name(Layout l) { return l == Layout::kNN ? "NN" : l == Layout::kNT ? "NT" : "TN"; }

// How each leading dim (A's, B's, C's) is chosen from its stored row length.
enum class Ld {
  kTight,    // = the row length
  kAligned,  // rounded up to 16 bytes (rung 9 takes every size)
  kPlus8,    // + 8 elements
  kOdd,      // the next odd number: rows off 16-byte (and 4-byte for 16-bit dtypes) alignment
};
const char* ld_name(Ld ld) {
  return ld == Ld::kTight ? "tight" : ld == Ld::kAligned ? "aligned" : ld == Ld::kPlus8 ? "+8" : "odd";
}
int64_t leading_dim(Ld ld, int64_t row, DType dt) {
  const int64_t per16 = 16 / dtype_size(dt);
  switch (ld) {
    case Ld::kTight: return row;
    case Ld::kAligned: return (row + per16 - 1) / per16 * per16;
    case Ld::kPlus8: return row + 8;
    case Ld::kOdd: return row % 2 ? row + 2 : row + 1;
  }
  return row;
}

struct Case {
  int64_t M, N, K;
  Layout layout = Layout::kNN;
  Ld ld = Ld::kAligned;
  int64_t a_off = 0, b_off = 0, c_off = 0;  // element offsets from a 256-byte aligned allocation
  float alpha = 1.f, beta = 0.f;
  bool bias = false;
};

// The rungs this device can run: all of them on sm_90+, rung 9 left out before.
int top_rung() { return device_cc_major() >= 9 ? kGemmRungs : kHopperRung - 1; }

// (rows, cols) -> (cols, rows), values and bytes.
HostTensor transpose(const HostTensor& t, int64_t rows, int64_t cols) {
  const int64_t es = dtype_size(t.dtype);
  HostTensor out = empty_tensor(t.dtype, rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      out.values[c * rows + r] = t.values[r * cols + c];
      std::memcpy(out.bytes.data() + (c * rows + r) * es, t.bytes.data() + (r * cols + c) * es, es);
    }
  return out;
}

// A fresh buffer holding the stored (rows, cols) tensor t, rows `ld` elements apart starting `off`
// elements in; every other element (before, padding, a guard after the last row) is NaN.
std::unique_ptr<DeviceBuffer> upload_matrix(const HostTensor& t, int64_t rows, int64_t cols, int64_t ld, int64_t off) {
  const int64_t es = dtype_size(t.dtype);
  auto buf = std::make_unique<DeviceBuffer>(static_cast<size_t>((off + rows * ld + kGuard) * es));
  buf->poison();
  upload_row_bytes(buf->at(off * es), t.bytes.data(), rows, cols * es, ld * es);
  return buf;
}

// The leading dim that the validation reads from a 2-D view's strides (a dim of size 1 has no
// stride to honour: a single row's leading dim is its length).
int64_t view_ld(const TensorView& t) {
  const int64_t r = t.shape[0], c = t.shape[1], s0 = t.strides[0], s1 = t.strides[1];
  if ((c == 1 || s1 == 1) && (r == 1 || s0 >= c)) return r == 1 ? c : s0;
  return c == 1 ? r : s1;
}

// Rows of t in memory: its rows if row-major (as view_ld decides), else its columns.
int64_t stored_rows(const TensorView& t) {
  const int64_t r = t.shape[0], c = t.shape[1], s0 = t.strides[0], s1 = t.strides[1];
  return (c == 1 || s1 == 1) && (r == 1 || s0 >= c) ? r : c;
}

// One case in one dtype: host inputs, the reference, device views.
struct Problem {
  DType dt;
  Case c;
  HostTensor a, b, c_in, bias;  // a (M, K), b (K, N) row-major values; c_in (M, N) when beta != 0; bias (N,)
  std::vector<double> ref;      // (M, N) float64
  std::unique_ptr<DeviceBuffer> da, db, dc, dbias;
  TensorView av, bv, cv, biasv;
  int64_t ldc = 0;
};

std::unique_ptr<Problem> make_problem(DType dt, const Case& c, std::mt19937_64& rng) {
  auto p = std::make_unique<Problem>();
  p->dt = dt;
  p->c = c;
  const int64_t M = c.M, N = c.N, K = c.K, es = dtype_size(dt);
  p->a = random_tensor(dt, M * K, rng);
  p->b = random_tensor(dt, K * N, rng);
  if (c.beta != 0.f) p->c_in = random_tensor(dt, M * N, rng);
  if (c.bias) p->bias = random_tensor(dt, N, rng);
  const Device gpu{DeviceType::kCUDA, 0};

  // A: stored (M, K), or (K, M) behind a column-major view (TN); B: (K, N), or (N, K) (NT).
  const bool a_col = c.layout == Layout::kTN, b_col = c.layout == Layout::kNT;
  const int64_t lda = leading_dim(c.ld, a_col ? M : K, dt), ldb = leading_dim(c.ld, b_col ? K : N, dt);
  p->ldc = leading_dim(c.ld, N, dt);
  p->da = a_col ? upload_matrix(transpose(p->a, M, K), K, M, lda, c.a_off) : upload_matrix(p->a, M, K, lda, c.a_off);
  p->db = b_col ? upload_matrix(transpose(p->b, K, N), N, K, ldb, c.b_off) : upload_matrix(p->b, K, N, ldb, c.b_off);
  char* a0 = p->da->at(c.a_off * es);
  char* b0 = p->db->at(c.b_off * es);
  p->av = a_col ? TensorView(a0, dt, {M, K}, {1, lda}, gpu) : TensorView(a0, dt, {M, K}, {lda, 1}, gpu);
  p->bv = b_col ? TensorView(b0, dt, {K, N}, {1, ldb}, gpu) : TensorView(b0, dt, {K, N}, {ldb, 1}, gpu);
  p->dc = std::make_unique<DeviceBuffer>(static_cast<size_t>((c.c_off + M * p->ldc + kGuard) * es));
  p->cv = TensorView(p->dc->at(c.c_off * es), dt, {M, N}, {p->ldc, 1}, gpu);
  if (c.bias) {
    p->dbias = upload_matrix(p->bias, 1, N, N, 0);
    p->biasv = TensorView(p->dbias->ptr, dt, {N}, gpu);
  }
  p->ref = reference::gemm(p->a.values, p->b.values, M, N, K, c.alpha, c.beta, p->c_in.values, p->bias.values);
  return p;
}

// Whether `rung` takes the problem (include/flashlab/gemm.h): its dtype; layout NN only on
// rungs 2-8; on rung 9 16-byte aligned pointers and leading dims (except of a single stored row).
bool rung_takes(int rung, const Problem& p) {
  if (!gemm_rung_supports(rung, p.dt)) return false;
  if (p.c.layout != Layout::kNN && rung >= 2 && rung < kHopperRung) return false;
  if (rung == kHopperRung) {
    const int64_t es = dtype_size(p.dt);
    for (const TensorView* v : {&p.av, &p.bv, &p.cv})
      if (reinterpret_cast<uintptr_t>(v->data) % 16 != 0 || (stored_rows(*v) > 1 && view_ld(*v) * es % 16 != 0))
        return false;
  }
  return true;
}

::testing::Message describe(const Problem& p, int rung) {
  const Case& c = p.c;
  ::testing::Message m;
  m << "gemm rung " << rung << " " << dtype_name(p.dt) << " M " << c.M << " N " << c.N << " K " << c.K << " "
    << layout_name(c.layout) << " ld " << ld_name(c.ld) << " (lda " << view_ld(p.av) << ", ldb " << view_ld(p.bv)
    << ", ldc " << p.ldc << ")";
  if (c.a_off || c.b_off || c.c_off) m << " offsets " << c.a_off << "," << c.b_off << "," << c.c_off;
  if (c.alpha != 1.f || c.beta != 0.f || c.bias) m << " alpha " << c.alpha << " beta " << c.beta << (c.bias ? " bias" : "");
  return m;
}

// Runs `rung` into a freshly poisoned C and returns the (M, N) output; fails (and returns an
// empty vector) when the call throws or anything outside C's view was written.
std::vector<double> run_rung(const Problem& p, int rung) {
  const auto what = describe(p, rung);
  const Case& c = p.c;
  const int64_t es = dtype_size(p.dt);
  p.dc->poison();
  if (c.beta != 0.f) upload_row_bytes(p.cv.data, p.c_in.bytes.data(), c.M, c.N * es, p.ldc * es);
  GemmEpilogue epi;
  epi.alpha = c.alpha;
  epi.beta = c.beta;
  epi.bias = c.bias ? &p.biasv : nullptr;
  try {
    gemm(p.av, p.bv, p.cv, nullptr, rung, epi);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const Error& e) {
    ADD_FAILURE() << what << ": " << e.what();
    return {};
  }
  const auto bytes = download(p.dc->ptr, p.dc->bytes);
  std::vector<uint8_t> inside(static_cast<size_t>(c.M * c.N * es));
  int64_t stray = 0, first_stray = -1;
  for (int64_t i = 0; i < static_cast<int64_t>(bytes.size() / es); ++i) {
    const int64_t j = i - c.c_off, m = j / p.ldc, n = j % p.ldc;
    if (j >= 0 && m < c.M && n < c.N) {
      std::memcpy(inside.data() + (m * c.N + n) * es, bytes.data() + i * es, es);
    } else if (std::any_of(bytes.begin() + i * es, bytes.begin() + (i + 1) * es, [](uint8_t x) { return x != 0xff; })) {
      if (stray++ == 0) first_stray = j;
    }
  }
  if (stray) {
    ADD_FAILURE() << what << ": " << stray << " elements written outside C's view, the first at element " << first_stray
                  << " from C's start";
    return {};
  }
  return decode(p.dt, inside);
}

// Rung 1 on the host: per output a sequential fp32 sum over k (no FMA), the epilogue in fp32,
// one rounding to the dtype. *scale: max over outputs of |alpha| sum_k |a b| + |beta c| + |bias|.
std::vector<double> naive_on_host(const Problem& p, double* scale) {
  const Case& c = p.c;
  const std::vector<float> a(p.a.values.begin(), p.a.values.end()), b(p.b.values.begin(), p.b.values.end());
  std::vector<double> out(static_cast<size_t>(c.M * c.N));
  std::vector<float> acc(c.N), mag(c.N);
  *scale = 0;
  for (int64_t m = 0; m < c.M; ++m) {
    std::fill(acc.begin(), acc.end(), 0.f);
    std::fill(mag.begin(), mag.end(), 0.f);
    for (int64_t k = 0; k < c.K; ++k) {  // k outermost: each acc[n] still adds in k order
      const float x = a[m * c.K + k];
      const float* brow = &b[k * c.N];
      for (int64_t n = 0; n < c.N; ++n) {
        const float prod = x * brow[n];
        acc[n] += prod;
        mag[n] += std::fabs(prod);
      }
    }
    for (int64_t n = 0; n < c.N; ++n) {
      float v = c.alpha * acc[n];
      double s = std::fabs(static_cast<double>(c.alpha)) * mag[n];
      if (c.beta != 0.f) {
        const float cv = static_cast<float>(p.c_in.values[m * c.N + n]);
        v += c.beta * cv;
        s += std::fabs(static_cast<double>(c.beta) * cv);
      }
      if (c.bias) {
        v += static_cast<float>(p.bias.values[n]);
        s += std::fabs(p.bias.values[n]);
      }
      out[m * c.N + n] = round_to(p.dt, v);
      *scale = std::max(*scale, s);
    }
  }
  return out;
}

// Every rung this device runs on one case in one dtype: rung 1 against the host's naive result,
// every other rung that takes the case against rung 1, the others must refuse it.
void run_problem(const Problem& p) {
  double scale = 0;
  const auto naive = naive_on_host(p, &scale);
  double max_ref = 0;
  for (double r : p.ref) max_ref = std::max(max_ref, std::fabs(r));
  const double floor = unit_roundoff(p.dt) * max_ref + 4 * unit_roundoff(DType::kF32) * scale;

  ASSERT_TRUE(rung_takes(1, p)) << describe(p, 1);
  auto rung1 = run_rung(p, 1);
  if (!rung1.empty()) expect_within_tolerance(rung1, naive, p.ref, floor, describe(p, 1));
  const auto& baseline = rung1.empty() ? naive : rung1;  // rung 1's own failure is reported above

  for (int rung = 2; rung <= top_rung(); ++rung) {
    if (!gemm_rung_supports(rung, p.dt)) continue;
    if (!rung_takes(rung, p)) {
      const int64_t launches = check::launch_count();
      EXPECT_THROW(gemm(p.av, p.bv, p.cv, nullptr, rung), Error) << describe(p, rung) << ": expected a refusal";
      EXPECT_EQ(check::launch_count(), launches) << describe(p, rung) << ": a refused call launched a kernel";
      continue;
    }
    const auto got = run_rung(p, rung);
    if (!got.empty()) expect_within_tolerance(got, baseline, p.ref, floor, describe(p, rung));
  }
}

void run_all(const Case& c, std::mt19937_64& rng, std::initializer_list<DType> dtypes = {DType::kF32, DType::kF16, DType::kBF16}) {
  for (DType dt : dtypes) run_problem(*make_problem(dt, c, rng));
}

TEST(Gemm, SizesInEachDim) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(1);
  for (int64_t s : {1, 17, 127, 129, 1000, 4096}) {
    run_all({s, 129, 127}, rng);
    run_all({129, s, 127}, rng);
    run_all({129, 127, s}, rng);
  }
}

TEST(Gemm, SquareSizes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2);
  for (int64_t s : {256, 512}) run_all({s, s, s}, rng);
  run_all({1024, 1024, 1024}, rng, {DType::kF32, DType::kBF16});
}

TEST(Gemm, PartialTilesAndManyTiles) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(3);
  // One past typical tile edges (64, 128, 256) in M and N, K just past a k-tile.
  run_all({257, 263, 520}, rng);
  run_all({65, 1000, 72}, rng);
  // Hundreds of 128 x 128 tiles: more than one wave of a persistent kernel on an H100.
  run_all({4096, 2048, 64}, rng, {DType::kF16, DType::kBF16});
  run_all({2048, 1032, 200}, rng, {DType::kF32});
}

// Operands stored as one row have no leading dim: rung 9 takes them whatever their length
// (decode-like M = 1: A and C one row each, K and N not multiples of 8), with B's rows aligned.
TEST(Gemm, SingleRowOperands) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(12);
  for (const Case& c : std::vector<Case>{{1, 136, 77, Layout::kNN, Ld::kTight},
                                         {1, 1000, 77, Layout::kNN, Ld::kTight},
                                         {1, 77, 136, Layout::kNT, Ld::kTight},
                                         {1, 333, 1000, Layout::kNT, Ld::kTight}}) {
    const auto p = make_problem(DType::kBF16, c, rng);
    if (device_cc_major() == 9) ASSERT_TRUE(rung_takes(kHopperRung, *p)) << describe(*p, kHopperRung);
    run_problem(*p);
  }
}

TEST(Gemm, LeadingDims) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(4);
  for (Ld ld : {Ld::kTight, Ld::kPlus8, Ld::kOdd}) {
    for (const Case& c : std::vector<Case>{{17, 129, 127}, {129, 127, 1000}, {64, 64, 64}, {128, 256, 512}, {1, 1, 1},
                                           {1, 300, 77}, {300, 1, 77}, {300, 77, 1}}) {
      Case cl = c;
      cl.ld = ld;
      run_all(cl, rng);
    }
  }
}

TEST(Gemm, MisalignedPointers) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  // Element-aligned pointers off 16-byte alignment (rung 9 refuses them).
  for (const Case& c : std::vector<Case>{{129, 127, 1000, Layout::kNN, Ld::kTight, 1, 3, 1},
                                         {128, 128, 128, Layout::kNN, Ld::kAligned, 2, 0, 0},
                                         {128, 128, 128, Layout::kNN, Ld::kAligned, 0, 1, 0},
                                         {128, 128, 128, Layout::kNN, Ld::kAligned, 0, 0, 3},
                                         {77, 200, 300, Layout::kNN, Ld::kOdd, 1, 1, 1},
                                         {256, 256, 256, Layout::kNN, Ld::kPlus8, 8, 8, 8}})
    run_all(c, rng);
}

TEST(Gemm, Epilogue) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(6);
  for (int64_t s : {129, 256}) {
    const int64_t k = s == 129 ? 300 : 256;
    run_all({s, s - 2, k, Layout::kNN, Ld::kAligned, 0, 0, 0, 2.f, 0.f, true}, rng);
    run_all({s, s - 2, k, Layout::kNN, Ld::kAligned, 0, 0, 0, 0.5f, -1.5f, false}, rng);
    run_all({s, s - 2, k, Layout::kNN, Ld::kAligned, 0, 0, 0, -1.f, 1.f, true}, rng);
    run_all({s, s - 2, k, Layout::kNN, Ld::kAligned, 0, 0, 0, 0.f, 1.f, true}, rng);  // alpha 0: beta c + bias
  }
  // With padded C rows: beta reads C through ldc; the padding stays untouched.
  run_all({100, 64, 128, Layout::kNN, Ld::kPlus8, 0, 0, 0, 1.f, 0.25f, true}, rng);
}

TEST(Gemm, TransposedLayouts) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  for (Layout l : {Layout::kNT, Layout::kTN}) {
    for (Ld ld : {Ld::kAligned, Ld::kPlus8}) {
      run_all({129, 127, 1000, l, ld}, rng);
      run_all({256, 512, 128, l, ld}, rng);
      run_all({1, 128, 64, l, ld}, rng);
      run_all({128, 8, 4096, l, ld}, rng);
    }
    run_all({129, 127, 77, l, Ld::kOdd}, rng);  // rung 1 only
    run_all({257, 136, 520, l, Ld::kAligned, 0, 0, 0, 0.5f, 2.f, true}, rng);
  }
}

TEST(Gemm, HopperRungEdges) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() < 9)
    GTEST_SKIP() << "rung 9 needs sm_90 (TMA, wgmma); this device is sm_" << device_cc_major() << "x";
  std::mt19937_64 rng(8);
  // Shapes whose leading dims are all 16-byte multiples without padding: decode-like rows,
  // one output column, K of one 16-byte vector, M and N below one tile.
  for (const Case& c : std::vector<Case>{{1, 256, 4096, Layout::kNN, Ld::kTight},
                                         {1, 4096, 256, Layout::kNT, Ld::kTight},
                                         {3, 8, 8, Layout::kNN, Ld::kTight},
                                         {1000, 1, 136, Layout::kNN, Ld::kAligned},
                                         {8, 8, 4104, Layout::kTN, Ld::kTight},
                                         {2048, 2048, 8, Layout::kNN, Ld::kTight},
                                         {128, 12288, 256, Layout::kNT, Ld::kTight}})
    run_all(c, rng, {DType::kF16, DType::kBF16});
}

TEST(Gemm, HopperRungRefusedBeforeSm90) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() >= 9) GTEST_SKIP() << "an sm_90+ device: rung 9 runs in the other tests";
  DeviceBuffer buf(3 * 64 * 64 * 2);
  const Device gpu{DeviceType::kCUDA, 0};
  const TensorView a(buf.ptr, DType::kBF16, {64, 64}, gpu), b(buf.at(8192), DType::kBF16, {64, 64}, gpu),
      c(buf.at(16384), DType::kBF16, {64, 64}, gpu);
  const int64_t launches = check::launch_count();
  try {
    gemm(a, b, c, nullptr, kHopperRung);
    ADD_FAILURE() << "expected flashlab::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("compute capability 9.x"), std::string::npos) << e.what();
  }
  EXPECT_EQ(check::launch_count(), launches);
}

TEST(Gemm, RejectedCallLaunchesNothingAndWritesNothing) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer buf(65536);
  buf.poison();
  const auto before = download(buf.ptr, buf.bytes);
  const int64_t launches = check::launch_count();
  const Device gpu{DeviceType::kCUDA, 0};
  const TensorView a(buf.ptr, DType::kF32, {32, 64}, gpu), b(buf.at(16384), DType::kF32, {64, 32}, gpu);
  // c overlaps b; then c misaligned; then an fp32 problem on a tensor-core rung; then NT on rung 3.
  EXPECT_THROW(gemm(a, b, TensorView(buf.at(16384 + 256), DType::kF32, {32, 32}, gpu), nullptr, 1), Error);
  EXPECT_THROW(gemm(a, b, TensorView(buf.at(40000 + 2), DType::kF32, {32, 32}, gpu), nullptr, 1), Error);
  EXPECT_THROW(gemm(a, b, TensorView(buf.at(40960), DType::kF32, {32, 32}, gpu), nullptr, 8), Error);
  EXPECT_THROW(gemm(a, TensorView(buf.at(16384), DType::kF32, {64, 32}, {1, 64}, gpu),
                    TensorView(buf.at(40960), DType::kF32, {32, 32}, gpu), nullptr, 3),
               Error);
  EXPECT_EQ(check::launch_count(), launches);
  EXPECT_EQ(download(buf.ptr, buf.bytes), before) << "a rejected call changed memory";
}

}  // namespace
}  // namespace flashlab
