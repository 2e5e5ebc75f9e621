"""The decoder layers of an uninstrumented forward as one TorchScript function: it runs without the GIL.

Why: a Python-level forward makes ~1,500 torch calls per step (30 layers x ~40 small ops), and each call
releases Python's GIL and must take it back. In the web app, page-building threads hold the GIL between
those calls (a JSON encoder, a list comprehension), and every hand-back waits for them: a 20-sequence decode
step that takes 90 ms alone took 1,400 ms beside one busy Python thread (measured on 2 cores, switch interval
0.2 ms). The TorchScript interpreter runs the whole layer stack in C++ after releasing the GIL once: beside
the same thread the step's forward took 91 ms against 72 alone (the rest is its Python input preparation;
the step's sampling stays Python).

The ops are the same eager kernels, in the same order, as `Model.forward`'s Python path, whose norm, rotation
and projections call the building blocks below. That path stays for instrumented forwards (attention capture,
logit lens, residual norms need Python between the ops); the two give bitwise equal logits and K/V
(tests/test_engine_fastpath.py). No fusion: TorchScript does not fuse on CPU unless asked to (tested too).

TorchScript is deprecated in favour of torch.compile, which on CPU compiles C++ at start-up and still calls
its kernels from Python. If a torch version cannot script this module, `LAYERS` is None and `Model` runs its
Python loop: slower beside busy threads, identical results.
"""
from __future__ import annotations

import logging
import warnings
from typing import List, Optional, Union

import torch
import torch.nn.functional as F

from . import native  # noqa: F401  (defines the torch.ops.inferlab schemas `matmul` calls)


# The matmul kernels of engine.kernels (`matmul` spells them as literals: TorchScript functions cannot read
# module globals)
MKL, ONEDNN, INT8, INT4, NATIVE_Q4, NATIVE_I8, NATIVE_F32, NATIVE_BF16 = 0, 1, 2, 3, 4, 5, 6, 7
STACK_KINDS = (MKL, INT8, INT4, NATIVE_Q4, NATIVE_I8, NATIVE_F32, NATIVE_BF16)  # what native decode_layers runs
NATIVE_KINDS = (NATIVE_Q4, NATIVE_I8, NATIVE_F32, NATIVE_BF16)  # the lab's own kernels (engine/native.py)


def matmul(x: torch.Tensor, kind: int, weight: torch.Tensor, aux: Optional[torch.Tensor],
           bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x @ W.T (+ bias) with one of engine.kernels' kernels. Inputs are cast to the weight's dtype (bf16 for the
    quantized kernels, which are fast only with bf16 activations) and results back to x's dtype."""
    same = x.dtype == weight.dtype
    if kind == 1:  # ONEDNN
        no_scalars: List[Optional[Union[float, int, complex]]] = []  # TorchScript's spelling of Scalar?[]
        y = torch.ops.mkldnn._linear_pointwise(x if same else x.to(weight.dtype), weight, bias if same else None,
                                               "none", no_scalars, "")
    elif kind == 2:  # INT8
        assert aux is not None
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), weight, aux)
        same = False
    elif kind == 3:  # INT4
        assert aux is not None
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), weight, 32, aux)
        same = False
    elif kind >= 4:  # NATIVE_Q4, NATIVE_I8, NATIVE_F32, NATIVE_BF16 (engine/native.py): float32 in and out
        if kind == 4:
            y = torch.ops.inferlab.q4_linear(x, weight)
        elif kind == 6:
            y = torch.ops.inferlab.f32_linear(x, weight)
        elif kind == 7:
            y = torch.ops.inferlab.bf16_linear(x, weight)
        else:
            y = torch.ops.inferlab.i8_linear(x, weight)
        return y if bias is None else y + bias
    else:
        y = F.linear(x if same else x.to(weight.dtype), weight, bias if same else None)
    if not same:
        y = y.to(x.dtype)
        if bias is not None:
            y = y + bias
    return y


def proj(x: torch.Tensor, i: int, kinds: List[int], weights: List[torch.Tensor], aux: List[Optional[torch.Tensor]],
         biases: List[Optional[torch.Tensor]], decode_max_rows: int) -> torch.Tensor:
    """Matrix i of the layers (4 per layer): engine.kernels.Linear's choice by the number of rows between its
    one-row kernel (entries 3i of kinds/weights/aux), its decode-batch kernel (3i + 1) and its prefill one."""
    rows = x.size(0)
    j = 3 * i if rows == 1 else 3 * i + 1 if rows <= decode_max_rows else 3 * i + 2
    return matmul(x, kinds[j], weights[j], aux[j], biases[i])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, native: bool = False) -> torch.Tensor:
    if x.dtype == torch.float32:  # one fused kernel instead of six small ones (decode is overhead-bound)
        if native and x.dim() == 2:  # the lab's own: ~1 us against F.rms_norm's ~10 (engine/native.py)
            return torch.ops.inferlab.rms_norm(x, weight, eps)
        return F.rms_norm(x, [x.size(-1)], weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
               new_slots: torch.Tensor, heads: int, kv_heads: int, head_dim: int, native: bool = False,
               q_norm: Optional[torch.Tensor] = None, k_norm: Optional[torch.Tensor] = None,
               eps: float = 0.0) -> torch.Tensor:
    """The new tokens' q and k rotated, their k and v written into the pool at their slots; returns q [N, H, D].
    q_norm and k_norm given (Qwen3): each q head and each k head is RMS-normalised with them (eps) before its
    rotation. native: one pass of the lab's (engine/native.py) instead of ~12 torch ops."""
    if native and qkv.dtype == torch.float32:
        return torch.ops.inferlab.rope_store(qkv, cos, sin, k_pool, v_pool, new_slots, heads, kv_heads, q_norm, k_norm,
                                             eps)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    qk = qkv[:, : q_size + kv_size].view(-1, heads + kv_heads, head_dim)
    if q_norm is not None and k_norm is not None:
        qk = torch.cat([rms_norm(qk[:, :heads], q_norm, eps), rms_norm(qk[:, heads:], k_norm, eps)], dim=1)
    # q and k heads side by side get their rotation in one pass
    qk = rope(qk, cos, sin)
    k_pool.index_copy_(0, new_slots, qk[:, heads:])
    v_pool.index_copy_(0, new_slots, qkv[:, q_size + kv_size:].view(-1, kv_heads, head_dim))
    return qk[:, :heads]


def silu_mul(gu: torch.Tensor, inter: int, native: bool = False) -> torch.Tensor:
    """silu(gate) * up from the fused gate/up projection."""
    if native and gu.dtype == torch.float32:
        return torch.ops.inferlab.silu_mul(gu)
    return F.silu(gu[:, :inter]) * gu[:, inter:]


def attend_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                  mask: Optional[torch.Tensor], lengths: Optional[torch.Tensor], num_kv_heads: int, head_dim: int,
                  scale: float, native: bool = False, window: int = 0) -> torch.Tensor:
    """Model._attend_decode without the probabilities: one query per sequence over its padded context (its last
    `window` tokens where window > 0). native: the lab's op reads K and V straight from the pool
    (engine/native.py) instead of ~8 torch ops."""
    if native and lengths is not None and q.dtype == torch.float32:
        return torch.ops.inferlab.decode_attention(q, k_pool, v_pool, slots, lengths, scale, window)
    B, T = slots.size(0), slots.size(1)
    k = k_pool.index_select(0, slots.view(-1)).view(B, T, num_kv_heads, head_dim)  # 4x faster than [slots]
    v = v_pool.index_select(0, slots.view(-1)).view(B, T, num_kv_heads, head_dim)
    qg = q.view(B, num_kv_heads, -1, head_dim)
    scores = torch.matmul(qg, k.permute(0, 2, 3, 1)) * scale
    visible = decode_visible(slots, mask, lengths, window)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v.transpose(1, 2)).view(B, -1, head_dim)


def decode_visible(slots: torch.Tensor, mask: Optional[torch.Tensor], lengths: Optional[torch.Tensor],
                   window: int) -> Optional[torch.Tensor]:
    """Which of a decode batch's padded context columns each query sees ([B, 1, 1, T], None: all): its context
    (`mask`), and of that only the last `window` tokens where window > 0 (the query sits at length - 1)."""
    if window <= 0 or lengths is None:
        return mask
    B, T = slots.size(0), slots.size(1)
    recent = torch.arange(T, device=slots.device).unsqueeze(0) >= (lengths - window).unsqueeze(1)
    recent = recent.view(B, 1, 1, T)
    return recent if mask is None else recent & mask


def causal_mask(start: int, n: int, window: int, device: torch.device) -> Optional[torch.Tensor]:
    """[n, start + n]: query i (at position start + i) sees keys j <= start + i, and with window > 0 only those
    with j > start + i - window (transformers' sliding-window mask); None where it would hide nothing."""
    ctx = start + n
    if n == 1 and (window <= 0 or ctx <= window):
        return None
    qpos = torch.arange(start, ctx, device=device).unsqueeze(1)
    kpos = torch.arange(ctx, device=device).unsqueeze(0)
    mask = kpos <= qpos
    if window > 0:
        mask = mask & (kpos > qpos - window)
    return mask


def attend_seqs(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, offsets: List[int],
                starts: List[int], slots: List[torch.Tensor], window: int = 0) -> torch.Tensor:
    """Model._attend_seq without capture, for each sequence of a mixed batch: causal SDPA over its context
    (window > 0: over the last `window` keys of each query)."""
    outs: List[torch.Tensor] = []
    for i in range(len(starts)):
        qs = q[offsets[i]:offsets[i + 1]]
        n = qs.size(0)
        ctx = starts[i] + n
        s = slots[i][:ctx]
        k = k_pool.index_select(0, s).transpose(0, 1)
        v = v_pool.index_select(0, s).transpose(0, 1)
        qh = qs.transpose(0, 1)
        mask = causal_mask(starts[i], n, window, q.device)
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, enable_gqa=True)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def layers(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, new_slots: torch.Tensor,
           k_pools: List[torch.Tensor], v_pools: List[torch.Tensor],
           in_norm: List[torch.Tensor], post_norm: List[torch.Tensor],
           kinds: List[int], weights: List[torch.Tensor], aux: List[Optional[torch.Tensor]],
           biases: List[Optional[torch.Tensor]], dims: List[int], eps: float, scale: float, decode_max_rows: int,
           decode_slots: Optional[torch.Tensor], decode_mask: Optional[torch.Tensor],
           decode_lengths: Optional[torch.Tensor], offsets: List[int], starts: List[int],
           seq_slots: List[torch.Tensor], native: bool, q_norm: List[torch.Tensor], k_norm: List[torch.Tensor],
           windows: List[int]) -> torch.Tensor:
    """Every layer of Model.forward's hot path; returns the residual stream after the last one.

    Four matrices per layer (qkv, o, gate_up, down), in that order: biases has one entry per matrix, and
    kinds/weights/aux three (its one-row, decode-batch and prefill kernels; see `proj`). dims: heads, kv heads,
    head dim, intermediate size. decode_slots given: every sequence decodes one token (one padded attention
    call); else attention runs per sequence over offsets/starts/seq_slots. native: the norms and decode attention
    run the lab's own ops (Model.native_ops). q_norm, k_norm: each layer's per-head q and k norm weights (Qwen3;
    empty lists where the model has none). windows: each layer's sliding window (0: the whole context).
    """
    H, KV, D, inter = dims[0], dims[1], dims[2], dims[3]
    for li in range(len(in_norm)):
        m = 4 * li
        h = rms_norm(x, in_norm[li], eps, native)
        qkv = proj(h, m, kinds, weights, aux, biases, decode_max_rows)
        qn: Optional[torch.Tensor] = None
        kn: Optional[torch.Tensor] = None
        if len(q_norm) > 0:
            qn, kn = q_norm[li], k_norm[li]
        q = rope_store(qkv, cos, sin, k_pools[li], v_pools[li], new_slots, H, KV, D, native, qn, kn, eps)
        if decode_slots is not None:
            out = attend_decode(q, k_pools[li], v_pools[li], decode_slots, decode_mask, decode_lengths, KV, D, scale,
                                native, windows[li])
        else:
            out = attend_seqs(q, k_pools[li], v_pools[li], offsets, starts, seq_slots, windows[li])
        x = x + proj(out.reshape(-1, H * D), m + 1, kinds, weights, aux, biases, decode_max_rows)
        h = rms_norm(x, post_norm[li], eps, native)
        gu = proj(h, m + 2, kinds, weights, aux, biases, decode_max_rows)
        x = x + proj(silu_mul(gu, inter, native), m + 3, kinds, weights, aux, biases, decode_max_rows)
    return x


def _script(fn):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # see the module docstring
        try:
            return torch.jit.script(fn)
        except Exception:  # noqa: BLE001 - any failure to script leaves the Python path, which is exact
            logging.getLogger(__name__).warning("TorchScript unavailable; layers run in Python", exc_info=True)
            return None


LAYERS = _script(layers)  # the functions `layers` calls are compiled with it
