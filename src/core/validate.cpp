#include "flashlab/validate.h"

#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace flashlab {

namespace detail {
void throw_cuda_error(int code, const char* what, const char* file, int line) {
  throw Error(concat("CUDA error ", code, " (",
                     cudaGetErrorString(static_cast<cudaError_t>(code)), ") from ", what, " at ",
                     file, ":", line));
}
}  // namespace detail

namespace check {

namespace {
std::atomic<int64_t> g_launches{0};

std::string list_dtypes(std::initializer_list<DType> allowed) {
  std::string s;
  for (DType d : allowed) s += (s.empty() ? "" : " or ") + std::string(dtype_name(d));
  return s;
}
}  // namespace

int64_t launch_count() { return g_launches.load(); }
void note_launch() { g_launches.fetch_add(1); }

void fail(const Arg& a, const std::string& expected, const std::string& got) {
  throw Error(detail::concat(a.op, ": argument '", a.name, "': expected ", expected, ", got ", got));
}

void cuda(const Arg& a) {
  if (!a.t.is_cuda()) fail(a, "a CUDA tensor", device_str(a.t.device) + " tensor");
  if (a.t.data == nullptr && a.t.numel() != 0) fail(a, "a non-null data pointer", "null");
}

void same_device(const Arg& a, const Arg& ref) {
  if (a.t.device.type != ref.t.device.type || a.t.device.index != ref.t.device.index)
    fail(a, detail::concat("a tensor on ", device_str(ref.t.device), " (same as '", ref.name, "')"),
         device_str(a.t.device));
}

void dtype_in(const Arg& a, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (a.t.dtype == d) return;
  fail(a, "dtype " + list_dtypes(allowed), dtype_name(a.t.dtype));
}

void dtype_eq(const Arg& a, const Arg& ref) {
  if (a.t.dtype != ref.t.dtype)
    fail(a, detail::concat("dtype ", dtype_name(ref.t.dtype), " (same as '", ref.name, "')"),
         dtype_name(a.t.dtype));
}

void ndim(const Arg& a, int n) {
  if (a.t.ndim() != n)
    fail(a, detail::concat(n, " dims"), detail::concat(a.t.ndim(), " dims, shape ", shape_str(a.t.shape)));
}

void shape_eq(const Arg& a, const Arg& ref) {
  if (a.t.shape != ref.t.shape)
    fail(a, detail::concat("shape ", shape_str(ref.t.shape), " (same as '", ref.name, "')"),
         shape_str(a.t.shape));
}

void shape(const Arg& a, std::initializer_list<int64_t> expected) {
  std::vector<int64_t> e(expected);
  if (a.t.shape != e) fail(a, "shape " + shape_str(e), shape_str(a.t.shape));
}

void contiguous(const Arg& a) {
  if (!a.t.is_contiguous())
    fail(a, "a contiguous tensor",
         detail::concat("strides ", shape_str(a.t.strides), " for shape ", shape_str(a.t.shape)));
}

void nonempty(const Arg& a) {
  if (a.t.numel() == 0) fail(a, "at least one element", "shape " + shape_str(a.t.shape));
}

void aligned(const Arg& a, int64_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(a.t.data);
  if (addr % static_cast<uintptr_t>(bytes) != 0)
    fail(a, detail::concat("a data pointer aligned to ", bytes, " bytes"),
         detail::concat("address 0x", std::hex, addr, std::dec, " (offset ", addr % bytes, ")"));
}

void last_dim_contiguous(const Arg& a) {
  if (a.t.ndim() > 0 && a.t.shape.back() != 1 && a.t.strides.back() != 1)
    fail(a, "unit stride in the last dim", detail::concat("strides ", shape_str(a.t.strides)));
}

void no_overlap(const Arg& a, const Arg& b) {
  if (a.t.data == b.t.data) return;  // exact aliasing (in-place) is allowed
  auto extent = [](const TensorView& t) {
    int64_t hi = 1;
    for (int i = 0; i < t.ndim(); ++i)
      if (t.shape[i] > 0) hi += (t.shape[i] - 1) * t.strides[i];
    return hi * dtype_size(t.dtype);
  };
  const auto a0 = reinterpret_cast<uintptr_t>(a.t.data), b0 = reinterpret_cast<uintptr_t>(b.t.data);
  const auto a1 = a0 + extent(a.t), b1 = b0 + extent(b.t);
  if (a0 < b1 && b0 < a1)
    fail(a, detail::concat("memory disjoint from '", b.name, "' or identical to it"),
         "a partial overlap");
}

namespace {

// Elements from a view's first to its last along the dims past dim 0, + 1 (-1 for a negative
// stride: no interleaving claimed then).
int64_t row_span(const TensorView& t) {
  int64_t span = 1;
  for (int i = 1; i < t.ndim(); ++i) {
    if (t.shape[i] > 1 && t.strides[i] < 0) return -1;
    if (t.shape[i] > 0) span += (t.shape[i] - 1) * t.strides[i];
  }
  return span;
}

// a's and b's rows share a dim-0 stride S (bytes), each row fits in S, and their offsets modulo
// S do not meet: row i of a and row j of b never share a byte.
bool rows_interleave(const TensorView& a, const TensorView& b) {
  if (a.ndim() < 1 || b.ndim() < 1) return false;
  const int64_t es_a = dtype_size(a.dtype), es_b = dtype_size(b.dtype), S = a.strides[0] * es_a;
  const int64_t span_a = row_span(a), span_b = row_span(b);
  if (S <= 0 || b.strides[0] * es_b != S || span_a < 0 || span_b < 0) return false;
  const int64_t ea = span_a * es_a, eb = span_b * es_b;
  if (ea > S || eb > S) return false;
  const int64_t delta = static_cast<int64_t>(reinterpret_cast<uintptr_t>(a.data) - reinterpret_cast<uintptr_t>(b.data));
  const int64_t r = ((delta % S) + S) % S;  // a's row offset within b's row, in [0, S)
  return r >= eb && r + ea <= S;
}

}  // namespace

void disjoint(const Arg& a, const Arg& b) {
  if (a.t.numel() == 0 || b.t.numel() == 0) return;
  if (a.t.data == b.t.data)
    fail(a, detail::concat("memory disjoint from '", b.name, "'"), detail::concat("the same memory as '", b.name, "'"));
  if (!rows_interleave(a.t, b.t)) no_overlap(a, b);
}

void aligned_rows(const Arg& a) {
  aligned(a, 16);
  const int per16 = 16 / static_cast<int>(dtype_size(a.t.dtype));  // elements in 16 bytes
  for (int dim = 0; dim + 1 < a.t.ndim(); ++dim)
    if (a.t.shape[dim] > 1 && a.t.strides[dim] % per16 != 0)
      fail(a, detail::concat("strides that are multiples of ", per16, " elements (16-byte aligned rows)"),
           detail::concat("strides ", shape_str(a.t.strides)));
}

void vector_rows(const Arg& a, int rank, std::initializer_list<DType> dtypes) {
  cuda(a);
  dtype_in(a, dtypes);
  ndim(a, rank);
  last_dim_contiguous(a);
  const int per16 = 16 / static_cast<int>(dtype_size(a.t.dtype));
  const int64_t d = a.t.shape.back();
  if (d < 1 || d % per16 != 0)
    fail(a, detail::concat("a head dim (last dim) that is a positive multiple of ", per16, " (16-byte vectors)"), detail::concat(d));
  aligned_rows(a);
}

void rows_disjoint(const Arg& a, const char* dim) {
  if (a.t.shape[0] > 1 && a.t.strides[0] < a.t.shape[1])
    fail(a, detail::concat(">= ", dim, " row stride (rows must not overlap)"),
         detail::concat("row stride ", a.t.strides[0], " for ", dim, " ", a.t.shape[1]));
}

void row_input(const Arg& a, const char* dim) {
  cuda(a);
  dtype_in(a, {DType::kF32, DType::kF16, DType::kBF16});
  ndim(a, 2);
  nonempty(a);
  last_dim_contiguous(a);
  rows_disjoint(a, dim);
  if (a.t.shape[0] > 0x7fffffff) fail(a, "at most 2^31 - 1 rows", std::to_string(a.t.shape[0]));
  aligned(a, dtype_size(a.t.dtype));
}

void rows_like(const Arg& a, const Arg& ref, const char* dim) {
  cuda(a);
  same_device(a, ref);
  dtype_eq(a, ref);
  shape_eq(a, ref);
  last_dim_contiguous(a);
  rows_disjoint(a, dim);
  aligned(a, dtype_size(a.t.dtype));
}

void row_vector(const Arg& a, const Arg& ref) {
  cuda(a);
  same_device(a, ref);
  dtype_eq(a, ref);
  shape(a, {ref.t.shape.back()});
  contiguous(a);
  aligned(a, dtype_size(a.t.dtype));
}

void rung(const char* op, int r, int num_rungs) {
  FLASHLAB_CHECK(r >= 1 && r <= num_rungs, op, ": argument 'rung': expected 1..", num_rungs,
                 ", got ", r);
}

}  // namespace check
}  // namespace flashlab
