// Constants of the streams pipeline shared by the kernel and the float64 reference.
#pragma once

namespace flashlab {

inline constexpr int kPipelinePolyDegree = 64;  // y = sum_k (-1)^k x^k / (k + 2), k = 0..64

}  // namespace flashlab
