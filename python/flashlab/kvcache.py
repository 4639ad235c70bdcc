"""``flash_attn_with_kvcache``: flash-attn's inference entry point over a KV cache, on flashlab's
serving kernels (C++: include/flashlab/serving.h).

One call (flash-attn 2.x's arguments, names and defaults): optionally rotates q and the new k by
``rotary_cos`` / ``rotary_sin``, writes the new ``k`` / ``v`` into the cache at positions
``cache_seqlens[b] ..`` (in place), then attends q to each sequence's ``cache_seqlens[b] +
seqlen_new`` keys, causally aligned bottom-right. The cache is either contiguous per sequence
((batch_cache, seqlen_cache, nheads_k, d), rows picked by ``cache_batch_idx``) or paged
((num_blocks, page_block_size, nheads_k, d) with ``block_table`` (batch, max_blocks) int32).
Both are handed to the kernels as a paged cache (a contiguous cache is one page per sequence):
one query per sequence (decode) runs ``batch_decode_paged`` (split-KV) unless a window or softcap
asks for the prefill kernel; otherwise ``batch_prefill_paged``. The page table is built on the
device with torch ops (no host synchronization), so a call can be captured in a CUDA graph.

Differences from flash-attn: torch tensors only; head dims 64, 128 or 256 (the prefill), fp16 /
bf16; ``window_size[1]`` must be -1 or 0 (0 is causal); ``alibi_slopes`` and ``cache_leftpad``
raise NotImplementedError; ``num_splits`` is accepted and ignored (the decode plans its own
split); the rotation runs in fp32 torch ops and rounds once. Outside a graph capture each call
checks the page table's values on the device (a synchronization).
"""

from __future__ import annotations

import sys
from typing import Any

from .serving import batch_decode_paged, batch_prefill_paged


def _torch(fn: str, q: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(q, torch.Tensor):
        raise TypeError(f"{fn}: argument 'q': expected a torch tensor (the cache is updated with torch indexing), "
                        f"got {type(q).__name__}")
    return torch


def _rotate(torch: Any, x: Any, cos: Any, sin: Any, pos: Any, interleaved: bool) -> Any:
    """x (b, s, h, d) rotated at positions pos (b, s) by cos / sin (seqlen_ro, rotary_dim / 2), in fp32."""
    rd = cos.shape[-1] * 2
    c, s = cos[pos].unsqueeze(2).float(), sin[pos].unsqueeze(2).float()
    xr = x[..., :rd].float()
    if interleaved:  # pairs (0, 1), (2, 3), ...
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:  # halves: (0, rd / 2), (1, rd / 2 + 1), ...
        x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
        rot = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rot.to(x.dtype), x[..., rd:]), dim=-1)


def csr_page_table(torch: Any, table: Any, seqlen_k: Any, page_size: int) -> tuple[Any, Any, Any]:
    """flash-attn's block table (batch, max_blocks) int32 and sequence lengths (batch,) as the
    serving ops' CSR page table (kv_indices, kv_indptr, kv_last_page_len): sequence b's pages
    table[b, :ceil(seqlen_k[b] / page_size)], built with device ops (no host synchronization: the
    indices tensor is as long as the whole table; entries past kv_indptr[batch] are not read)."""
    batch, max_blocks = table.shape
    seqlen_k = seqlen_k.to(torch.int32)
    pages = (seqlen_k + page_size - 1) // page_size
    kv_indptr = torch.zeros(batch + 1, device=table.device, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(pages, 0)
    j = torch.arange(batch * max_blocks, device=table.device, dtype=torch.int32)
    owner = torch.searchsorted(kv_indptr[1:], j, right=True).clamp(max=max(batch - 1, 0))
    offset = (j - kv_indptr[owner]).clamp(0, max_blocks - 1)
    kv_indices = table[owner.long(), offset.long()].contiguous()
    last = torch.where(pages > 0, seqlen_k - (pages - 1) * page_size, torch.zeros_like(seqlen_k)).to(torch.int32)
    return kv_indices, kv_indptr, last


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """q: (batch, seqlen_q, nheads, d); k_cache / v_cache: (batch_cache, seqlen_cache, nheads_k, d),
    or (num_blocks, page_block_size, nheads_k, d) with ``block_table``; k / v: optional (batch,
    seqlen_new, nheads_k, d) appended at ``cache_seqlens`` (int or int32 (batch,); None: the whole
    cache). Returns out (batch, seqlen_q, nheads, d), or ``(out, softmax_lse)`` with softmax_lse
    fp32 (batch, nheads, seqlen_q). See the module docstring for what differs from flash-attn.
    """
    fn = "flash_attn_with_kvcache"
    torch = _torch(fn, q)
    if alibi_slopes is not None:
        raise NotImplementedError(f"{fn}: argument 'alibi_slopes': expected None (not implemented over a KV cache)")
    if cache_leftpad is not None:
        raise NotImplementedError(f"{fn}: argument 'cache_leftpad': expected None (not implemented)")
    window_left, window_right = window_size
    if window_right not in (-1, 0):
        raise ValueError(f"{fn}: argument 'window_size': expected a right window of -1 or 0 (causal), got {window_right}")
    causal = bool(causal) or window_right == 0
    if (k is None) != (v is None):
        raise ValueError(f"{fn}: arguments 'k', 'v': expected both or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError(f"{fn}: arguments 'rotary_cos', 'rotary_sin': expected both or neither")
    if q.dim() != 4 or k_cache.dim() != 4:
        raise ValueError(f"{fn}: arguments 'q', 'k_cache': expected 4 dims, got {q.dim()} and {k_cache.dim()}")
    batch, seqlen_q, nheads, d = q.shape
    dev = q.device
    paged = block_table is not None
    if paged:
        if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.dtype != torch.int32:
            raise ValueError(f"{fn}: argument 'block_table': expected int32 (batch = {batch}, max_blocks), got "
                             f"{block_table.dtype} {list(block_table.shape)}")
        page_size, max_blocks = k_cache.shape[1], block_table.shape[1]
        table = block_table
    else:
        page_size, max_blocks = k_cache.shape[1], 1
        rows = torch.arange(batch, device=dev, dtype=torch.int32) if cache_batch_idx is None else cache_batch_idx
        table = rows.to(torch.int32).view(batch, 1)
    capacity = page_size * max_blocks
    if cache_seqlens is None:
        lens = torch.full((batch,), capacity, device=dev, dtype=torch.int32)
    elif isinstance(cache_seqlens, int):
        lens = torch.full((batch,), cache_seqlens, device=dev, dtype=torch.int32)
    else:
        lens = cache_seqlens.to(torch.int32)
    seqlen_new = 0 if k is None else k.shape[1]

    if rotary_cos is not None:
        new_pos = lens.long().view(batch, 1) + torch.arange(max(seqlen_new, seqlen_q), device=dev).view(1, -1)
        q_pos = new_pos[:, :seqlen_q] if causal or window_left >= 0 else lens.long().view(batch, 1).expand(batch, seqlen_q)
        q = _rotate(torch, q, rotary_cos, rotary_sin, q_pos, rotary_interleaved)
        if k is not None:
            k = _rotate(torch, k, rotary_cos, rotary_sin, new_pos[:, :seqlen_new], rotary_interleaved)
    if k is not None:  # append in place: token i of sequence b at position lens[b] + i
        pos = lens.long().view(batch, 1) + torch.arange(seqlen_new, device=dev).view(1, -1)
        page = table.long().gather(1, pos // page_size)  # (batch, seqlen_new)
        slot = pos % page_size
        k_cache[page, slot] = k.to(k_cache.dtype)
        v_cache[page, slot] = v.to(v_cache.dtype)

    kv_indices, kv_indptr, last = csr_page_table(torch, table, lens + seqlen_new, page_size)
    scale = None if softmax_scale is None else float(softmax_scale)

    if seqlen_q == 1 and window_left < 0 and not softcap:  # decode: split-KV over the pages
        out, lse = batch_decode_paged(q.reshape(batch, nheads, d), (k_cache, v_cache), kv_indices, kv_indptr, last,
                                      sm_scale=scale, return_lse=True)
        out, lse = out.view(batch, 1, nheads, d), lse.view(batch, nheads, 1)
    else:
        qo_indptr = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, device=dev, dtype=torch.int32)
        out, lse = batch_prefill_paged(q.reshape(batch * seqlen_q, nheads, d), qo_indptr, (k_cache, v_cache), kv_indices,
                                       kv_indptr, last, causal=causal, window_left=int(window_left),
                                       logits_soft_cap=float(softcap) if softcap else None, sm_scale=scale,
                                       return_lse=True, max_qo_len=seqlen_q)
        out, lse = out.view(batch, seqlen_q, nheads, d), lse.view(batch, seqlen_q, nheads).transpose(1, 2).contiguous()
    return (out, lse) if return_softmax_lse else out
