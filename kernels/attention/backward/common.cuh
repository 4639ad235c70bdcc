// What the tiled backward rungs (02_flash2.cuh, 03_hopper.cuh) share: P and dS g of one
// (row, key) element, recomputed from the raw dot products q . k and dout . v.
#pragma once

#include <climits>
#include <cmath>

#include "kernels/attention/common.cuh"
#include "kernels/common/online_softmax.cuh"

namespace flashlab::kernels {

// Whether a step of query rows m0 .. m0 + rows - 1 against keys n0 .. n0 + keys - 1 may hold an
// invisible (row, key) pair: keys past sk, or a window edge inside the step. The tiled rungs
// compile the element-wise mask in only for such steps.
__device__ __forceinline__ bool attn_bwd_step_needs_mask(const AttnScoreMod& mod, int m0, int rows, int n0, int keys, int sk) {
  return n0 + keys > sk || (mod.window_left >= 0 && n0 < m0 + rows - 1 + mod.diag - mod.window_left) ||
         (mod.window_right >= 0 && n0 + keys - 1 > m0 + mod.diag + mod.window_right);
}

// The rows that see `key` ([key - diag - window_right, key - diag + window_left], attn_visible;
// none for a key past sk) as offsets from row `base`, so that an element's mask is two compares
// with a constant: row base + x sees the key iff lo <= x <= hi.
struct AttnBwdRowBounds {
  int lo, hi;
};
__device__ __forceinline__ AttnBwdRowBounds attn_bwd_row_bounds(const AttnScoreMod& mod, int key, int base, int sk) {
  return {key >= sk ? INT_MAX : mod.window_right >= 0 ? key - mod.diag - mod.window_right - base : INT_MIN,
          mod.window_left >= 0 ? key - mod.diag + mod.window_left - base : INT_MAX};
}

// The score modifiers of one (batch, query head) in the units the element-wise step uses.
struct AttnBwdScore {
  AttnScoreMod mod;
  float scale_log2, slope_log2;  // scale and ALiBi slope times log2(e)
  float cap_inv, cap_log2;       // softcap: scale / softcap and softcap log2(e)

  __device__ __forceinline__ explicit AttnBwdScore(const AttnScoreMod& m) : mod(m) {
    constexpr float kLog2e = 1.4426950408889634f;
    scale_log2 = m.scale * kLog2e, slope_log2 = m.slope * kLog2e;
    cap_inv = m.softcap > 0.f ? m.scale / m.softcap : 0.f, cap_log2 = m.softcap * kLog2e;
  }

  // Element (row i, key) with raw dot products dot = q_i . k_key and dpv = dout_i . v_key; lse2 =
  // lse_i log2(e) (+inf for a row that sees no key), dsum = D_i, dsum_g = D_i scale; z the
  // dropout weight (1 without dropout). pr = P (times z: what dV takes), ds = dS g (g = d s / d dot:
  // the scale, times 1 - tanh^2 with softcap). Without score modifiers (kScoreMod false): one FFMA,
  // one EX2, one FFMA and one FMUL.
  template <bool kScoreMod, bool kDropout>
  __device__ __forceinline__ void p_ds(float dot, float dpv, int i, int key, bool visible, float lse2, float dsum,
                                       float dsum_g, float z, float& pr, float& ds) const {
    if constexpr (kScoreMod) {
      float x, grad = mod.scale;
      if (mod.softcap > 0.f) {
        const float th = tanhf(dot * cap_inv);
        x = cap_log2 * th;
        grad *= 1.f - th * th;
      } else {
        x = dot * scale_log2;
      }
      if (mod.slope != 0.f) x -= slope_log2 * fabsf(static_cast<float>(i + mod.diag - key));
      pr = visible ? exp2_approx_ftz(x - lse2) : 0.f;
      ds = pr * (dpv * z - dsum) * grad;
      if constexpr (kDropout) pr *= z;
    } else {
      static_assert(!kDropout, "dropout takes the generic element-wise path");
      pr = visible ? exp2_approx_ftz(fmaf(dot, scale_log2, -lse2)) : 0.f;
      ds = pr * fmaf(dpv, mod.scale, -dsum_g);
    }
  }
};

}  // namespace flashlab::kernels
