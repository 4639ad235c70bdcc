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

As flash-attn: q, k, v and the cache share one dtype, fp16 or bf16 (nothing is converted);
``cache_seqlens`` is an int or int32; a negative window size is unbounded; ``rotary_cos`` /
``rotary_sin`` need new ``k`` / ``v`` (rejected without: flash-attn rotates q and the new keys
only when appending), the new keys at ``cache_seqlens[b] + i`` and the queries there too when the
mask is causal or local, else every query at ``cache_seqlens[b]``; ``cache_batch_idx`` with
``block_table`` is rejected.

Differences from flash-attn: torch tensors only; head dims 64, 128 or 256 (the prefill; the
decode, one query without window or softcap, also takes 32, 96 and 192); ``window_size[1]`` must
be -1 or 0 (0 is causal); ``alibi_slopes`` and ``cache_leftpad`` raise NotImplementedError;
``num_splits`` is accepted and ignored (the decode plans its own split); the rotation runs in fp32
torch ops and rounds once. Every argument is checked before the cache is written. Outside a graph
capture that includes one read of the device (a synchronization): ``cache_seqlens`` + the new
length within the cache (block_table.shape[1] x page_block_size, or seqlen_cache), the rotated
positions within ``rotary_cos`` and the table entries used within the pool; then the kernels
check the page table's values again (another). During a capture nothing is read back: the caller
guarantees the lengths.
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


def csr_page_table(torch: Any, table: Any, seqlen_k: Any, page_size: int, num_pages: int) -> tuple[Any, Any, Any]:
    """flash-attn's block table (batch, max_blocks) int32 and sequence lengths (batch,) as the
    serving ops' CSR page table (kv_indices, kv_indptr, kv_last_page_len): sequence b's pages
    table[b, :ceil(seqlen_k[b] / page_size)], built with device ops (no host synchronization: the
    indices tensor is as long as the whole table; entries past kv_indptr[batch] are not read).
    A page a sequence needs past the end of its row (more than max_blocks pages) is written as
    ``num_pages`` (the pool's size), out of range: the serving ops' table check rejects it, where
    they check (outside a CUDA-graph capture), instead of the row's last page being repeated."""
    batch, max_blocks = table.shape
    seqlen_k = seqlen_k.to(torch.int32)
    pages = (seqlen_k + page_size - 1) // page_size
    kv_indptr = torch.zeros(batch + 1, device=table.device, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(pages, 0)
    j = torch.arange(batch * max_blocks, device=table.device, dtype=torch.int32)
    owner = torch.searchsorted(kv_indptr[1:], j, right=True).clamp(max=max(batch - 1, 0))
    offset = j - kv_indptr[owner]
    inside = table[owner.long(), offset.clamp(0, max(max_blocks - 1, 0)).long()]
    kv_indices = torch.where(offset < max_blocks, inside, num_pages).to(torch.int32).contiguous()
    last = torch.where(pages > 0, seqlen_k - (pages - 1) * page_size, torch.zeros_like(seqlen_k)).to(torch.int32)
    return kv_indices, kv_indptr, last


def capturing(torch: Any, x: Any) -> bool:
    """Whether the current CUDA stream of x's device is being captured into a CUDA graph (then
    nothing may be read back from the device)."""
    return bool(x.is_cuda) and torch.cuda.is_current_stream_capturing()


def check_block_table(torch: Any, fn: str, block_table: Any, batch: int) -> None:
    """flash-attn's block_table: an int32 torch tensor (batch, max_blocks)."""
    if not isinstance(block_table, torch.Tensor):
        raise ValueError(f"{fn}: argument 'block_table': expected an int32 tensor (batch = {batch}, max_blocks), got "
                         f"{type(block_table).__name__}")
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.dtype != torch.int32:
        raise ValueError(f"{fn}: argument 'block_table': expected int32 (batch = {batch}, max_blocks), got "
                         f"{block_table.dtype} {list(block_table.shape)}")


_PREFILL_HEAD_DIMS = (64, 128, 256)  # batch_prefill_paged (include/flashlab/serving.h)
_DECODE_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # batch_decode_paged


def _check_tensors(torch: Any, fn: str, q: Any, k_cache: Any, v_cache: Any, k: Any, v: Any) -> None:
    """Dims, dtypes and shapes of q, the cache and the new k / v (host-only: no device reads)."""
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)] + ([("k", k), ("v", v)] if k is not None else [])
    for name, x in named:
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            got = f"{x.dim()} dims" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{fn}: argument '{name}': expected a 4-dim torch tensor, got {got}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"{fn}: argument 'q': expected fp16 or bf16, got {q.dtype}")
    for name, x in named[1:]:  # flash-attn: the cache in q's dtype, the new k / v in the cache's
        if x.dtype != q.dtype:
            raise ValueError(f"{fn}: argument '{name}': expected q's dtype {q.dtype}, got {x.dtype}")
    for name, x in named[1:3]:  # written in place and read by the kernels as they are
        if x.stride(3) != 1:
            raise ValueError(f"{fn}: argument '{name}': expected a contiguous head dim (stride 1), got stride {x.stride(3)}")
    batch, _, nheads, d = q.shape
    if k_cache.shape[3] != d:
        raise ValueError(f"{fn}: argument 'k_cache': expected q's head dim {d}, got {list(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"{fn}: argument 'v_cache': expected k_cache's shape {list(k_cache.shape)}, got "
                         f"{list(v_cache.shape)}")
    nheads_k = k_cache.shape[2]
    if nheads_k < 1 or nheads % nheads_k:
        raise ValueError(f"{fn}: argument 'k_cache': expected a KV head count dividing q's {nheads} heads, got {nheads_k}")
    if k is not None:
        want = [batch, k.shape[1], nheads_k, d]
        for name, x in (("k", k), ("v", v)):
            if list(x.shape) != want:
                raise ValueError(f"{fn}: argument '{name}': expected (batch, seqlen_new, nheads_k, headdim) = {want}, "
                                 f"got {list(x.shape)}")


def _seqlens(torch: Any, fn: str, cache_seqlens: Any, batch: int, capacity: int, dev: Any, appending: bool) -> Any:
    """cache_seqlens as an int32 (batch,) tensor: an int, an int32 (batch,) tensor, or None (the whole cache)."""
    if cache_seqlens is None:
        if appending:
            raise ValueError(f"{fn}: argument 'cache_seqlens': expected the cache's lengths with new 'k', 'v' (None "
                             "means every sequence fills the cache: no room to append), got None")
        return torch.full((batch,), capacity, device=dev, dtype=torch.int32)
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        if cache_seqlens < 0:
            raise ValueError(f"{fn}: argument 'cache_seqlens': expected a value >= 0, got {cache_seqlens}")
        return torch.full((batch,), cache_seqlens, device=dev, dtype=torch.int32)
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 or \
            list(cache_seqlens.shape) != [batch]:
        got = (f"{cache_seqlens.dtype} {list(cache_seqlens.shape)}" if isinstance(cache_seqlens, torch.Tensor)
               else type(cache_seqlens).__name__)
        raise ValueError(f"{fn}: argument 'cache_seqlens': expected an int or an int32 tensor (batch = {batch},), got {got}")
    return cache_seqlens


def _check_lengths(torch: Any, fn: str, lens: Any, seqlen_new: int, table: Any, table_what: tuple[str, str],
                   page_size: int, num_pages: int, capacity: str, rotary_rows: int | None, rotated: int) -> None:
    """What needs the device's values (one read, a synchronization; never during a capture): every
    length >= 0, cache_seqlens + seqlen_new within the cache, the rotated positions within
    rotary_cos, and the table entries the call writes or reads within the pool."""
    cap = table.shape[1] * page_size
    total = lens.long() + seqlen_new
    pages = (total.clamp(0, cap) + page_size - 1) // page_size
    used = torch.arange(table.shape[1], device=table.device).view(1, -1) < pages.view(-1, 1)
    bad = used & ((table < 0) | (table >= num_pages))
    host = torch.stack((lens.long(), bad.any(1).long())).cpu().tolist()
    for b, (n, bad_row) in enumerate(zip(*host)):
        if n < 0:
            raise ValueError(f"{fn}: argument 'cache_seqlens': expected values >= 0, got {n} for sequence {b}")
        if n + seqlen_new > cap:
            raise ValueError(f"{fn}: argument 'cache_seqlens': expected cache_seqlens + seqlen_new (k's length) <= "
                             f"{cap} ({capacity}), got {n} + {seqlen_new} for sequence {b}")
        if rotary_rows is not None and n + rotated > rotary_rows:
            raise ValueError(f"{fn}: argument 'rotary_cos': expected at least cache_seqlens + {rotated} = {n + rotated} "
                             f"rows (the rotated positions of sequence {b}), got {rotary_rows}")
        if bad_row:
            row = table[b].tolist()
            j = next(j for j, p in enumerate(row) if p < 0 or p >= num_pages)
            raise ValueError(f"{fn}: argument '{table_what[0]}': expected {table_what[1]} in [0, {num_pages}), got "
                             f"{row[j]} (sequence {b}, entry {j})")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """q: (batch, seqlen_q, nheads, d); k_cache / v_cache: (batch_cache, seqlen_cache, nheads_k, d),
    or (num_blocks, page_block_size, nheads_k, d) with ``block_table``; k / v: optional (batch,
    seqlen_new, nheads_k, d) appended at ``cache_seqlens`` (int or int32 (batch,); None: the whole
    cache, so nothing can be appended). Returns out (batch, seqlen_q, nheads, d), or ``(out,
    softmax_lse)`` with softmax_lse fp32 (batch, nheads, seqlen_q). Every argument is checked
    before the cache is written. See the module docstring for what differs from flash-attn.
    """
    fn = "flash_attn_with_kvcache"
    torch = _torch(fn, q)
    from .flash_attn_interface import _window
    if alibi_slopes is not None:
        raise NotImplementedError(f"{fn}: argument 'alibi_slopes': expected None (not implemented over a KV cache)")
    if cache_leftpad is not None:
        raise NotImplementedError(f"{fn}: argument 'cache_leftpad': expected None (not implemented)")
    window_left, window_right = _window(fn, window_size)  # a negative side is unbounded (-1), as flash-attn
    if window_right not in (-1, 0):
        raise ValueError(f"{fn}: argument 'window_size': expected a right window of -1 or 0 (causal), got {window_right}")
    causal = bool(causal) or window_right == 0
    if (k is None) != (v is None):
        raise ValueError(f"{fn}: arguments 'k', 'v': expected both or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError(f"{fn}: arguments 'rotary_cos', 'rotary_sin': expected both or neither")
    if rotary_cos is not None and k is None:
        raise ValueError(f"{fn}: arguments 'rotary_cos', 'rotary_sin': expected new 'k', 'v' with them (flash-attn "
                         "rotates only what it appends, and q with it), got k None")
    paged = block_table is not None
    if paged and cache_batch_idx is not None:
        raise ValueError(f"{fn}: argument 'cache_batch_idx': expected None with 'block_table' (as flash-attn), got "
                         f"{type(cache_batch_idx).__name__}")
    _check_tensors(torch, fn, q, k_cache, v_cache, k, v)
    batch, seqlen_q, nheads, d = q.shape
    seqlen_new = 0 if k is None else k.shape[1]
    decode = seqlen_q == 1 and window_left < 0 and not softcap  # else the prefill kernel
    head_dims = _DECODE_HEAD_DIMS if decode else _PREFILL_HEAD_DIMS
    if d not in head_dims:
        raise ValueError(f"{fn}: argument 'q': expected a head dim in {head_dims} (the "
                         f"{'decode' if decode else 'prefill'} kernel), got {d}")
    dev = q.device
    page_size = k_cache.shape[1]
    if paged:
        check_block_table(torch, fn, block_table, batch)
        table, table_what = block_table, ("block_table", "page indices (the blocks of 'k_cache')")
        capacity = f"block_table's {block_table.shape[1]} blocks of page_block_size {page_size}"
    else:
        if cache_batch_idx is None:
            if k_cache.shape[0] < batch:
                raise ValueError(f"{fn}: argument 'k_cache': expected at least batch = {batch} sequences without "
                                 f"'cache_batch_idx', got {k_cache.shape[0]}")
            rows = torch.arange(batch, device=dev, dtype=torch.int32)
        elif not isinstance(cache_batch_idx, torch.Tensor) or cache_batch_idx.dtype != torch.int32 or \
                list(cache_batch_idx.shape) != [batch]:
            got = (f"{cache_batch_idx.dtype} {list(cache_batch_idx.shape)}" if isinstance(cache_batch_idx, torch.Tensor)
                   else type(cache_batch_idx).__name__)
            raise ValueError(f"{fn}: argument 'cache_batch_idx': expected int32 (batch = {batch},), got {got}")
        else:
            rows = cache_batch_idx
        table, table_what = rows.view(batch, 1), ("cache_batch_idx", "rows of 'k_cache'")
        capacity = f"seqlen_cache {page_size}"
    lens = _seqlens(torch, fn, cache_seqlens, batch, page_size * table.shape[1], dev, k is not None)
    # flash-attn's positions: new token i of sequence b at cache_seqlens[b] + i; query i there too when
    # the mask is causal or local, else every query at cache_seqlens[b].
    q_follows = causal or window_left >= 0
    rotary_rows = None
    if rotary_cos is not None:
        for name, x in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            if not isinstance(x, torch.Tensor) or x.dim() != 2 or not 1 <= x.shape[1] <= d // 2 or \
                    x.shape != rotary_cos.shape:
                got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{fn}: argument '{name}': expected (seqlen_ro, rotary_dim / 2) with rotary_dim <= "
                                 f"headdim {d}, sin as cos, got {got}")
        rotary_rows = rotary_cos.shape[0]
    if not capturing(torch, q):
        _check_lengths(torch, fn, lens, seqlen_new, table, table_what, page_size, k_cache.shape[0], capacity,
                       rotary_rows, max(seqlen_new, seqlen_q if q_follows else 1))

    # Everything is checked: from here the cache is written.
    if rotary_cos is not None:
        new_pos = lens.long().view(batch, 1) + torch.arange(max(seqlen_new, seqlen_q), device=dev).view(1, -1)
        q_pos = new_pos[:, :seqlen_q] if q_follows else lens.long().view(batch, 1).expand(batch, seqlen_q)
        q = _rotate(torch, q, rotary_cos, rotary_sin, q_pos, rotary_interleaved)
        k = _rotate(torch, k, rotary_cos, rotary_sin, new_pos[:, :seqlen_new], rotary_interleaved)
    if k is not None:  # append in place: token i of sequence b at position lens[b] + i
        pos = lens.long().view(batch, 1) + torch.arange(seqlen_new, device=dev).view(1, -1)
        page = table.long().gather(1, pos // page_size)  # (batch, seqlen_new)
        slot = pos % page_size
        k_cache[page, slot] = k
        v_cache[page, slot] = v

    kv_indices, kv_indptr, last = csr_page_table(torch, table, lens + seqlen_new, page_size, k_cache.shape[0])
    scale = None if softmax_scale is None else float(softmax_scale)

    if decode:  # split-KV over the pages
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
