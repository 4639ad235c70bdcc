// Argument checks shared by every public entry. Each throws flashlab::Error with the message
//   <op>: argument '<name>': expected <what>, got <what was given>
// and is called before anything is launched, so a rejected call changes nothing.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "flashlab/error.h"
#include "flashlab/tensor.h"

namespace flashlab::check {

// Names the op and the argument for every message below.
struct Arg {
  const char* op;
  const char* name;
  const TensorView& t;
};

[[noreturn]] void fail(const Arg& a, const std::string& expected, const std::string& got);

void cuda(const Arg& a);                                     // on a CUDA device, non-null
void same_device(const Arg& a, const Arg& ref);              // same CUDA device index
void dtype_in(const Arg& a, std::initializer_list<DType> allowed);
void dtype_eq(const Arg& a, const Arg& ref);
void ndim(const Arg& a, int n);
void shape_eq(const Arg& a, const Arg& ref);
void shape(const Arg& a, std::initializer_list<int64_t> expected);
void contiguous(const Arg& a);
void nonempty(const Arg& a);
void aligned(const Arg& a, int64_t bytes);                   // data pointer multiple of bytes
void last_dim_contiguous(const Arg& a);                      // stride[-1] == 1
void no_overlap(const Arg& a, const Arg& b);                 // disjoint memory ranges (unless identical)
// a and b share no element, identical views rejected too (an output and an input a kernel reads
// from other blocks). Views whose rows (dim 0) interleave in one buffer without sharing an
// element pass although their address ranges overlap: q and k sliced from a packed qkv, k and
// v = t[:, 0], t[:, 1] of one paged cache.
void disjoint(const Arg& a, const Arg& b);
// 16-byte aligned rows: the data pointer, and the stride of every dim of size > 1 but the last,
// multiples of 16 bytes (vector and cp.async / TMA copies of each row).
void aligned_rows(const Arg& a);
// Rows of whole 16-byte vectors (attention-state and KV-cache tensors): CUDA, one of `dtypes`
// (default fp32 / fp16 / bf16), `rank` dims, a contiguous last dim that is a positive multiple of
// 16 bytes, aligned_rows.
void vector_rows(const Arg& a, int rank,
                 std::initializer_list<DType> dtypes = {DType::kF32, DType::kF16, DType::kBF16});
// 2-D a: rows do not overlap (row stride >= the row length, any stride for one row); `dim`
// names the row length in the message ("cols", "hidden").
void rows_disjoint(const Arg& a, const char* dim);
// The row ops' (norms, softmax) input: CUDA, fp32/fp16/bf16, [rows, `dim`] with rows >= 1,
// rows <= 2^31 - 1, unit last stride, disjoint rows, element-aligned.
void row_input(const Arg& a, const char* dim);
// A row tensor shaped and typed like `ref` (an output, a residual), same checks on its layout.
void rows_like(const Arg& a, const Arg& ref, const char* dim);
// A per-column vector of `ref` (weight, bias): [ref's last dim], same dtype and device, contiguous.
void row_vector(const Arg& a, const Arg& ref);
void rung(const char* op, int rung, int num_rungs);          // 1 <= rung <= num_rungs

// Counts kernel launches made by the library (every FLASHLAB_LAUNCH). Tests use it to prove
// that a rejected call launched nothing.
int64_t launch_count();
void note_launch();

}  // namespace flashlab::check
