"""Timings, bytes and FLOPs per step, this machine's measured roofline, and the whiteboard formulas.

A decode step must read every weight once, so at batch 1 its time is bounded below by
weight_bytes / memory_bandwidth; that bound, and how close a measured step comes to it, is the roofline
story the lab tells. The estimates here count the big terms only: weights, K/V read and written, and the
matmul/attention FLOPs. Activations are ignored (they are kilobytes next to hundreds of megabytes).
"""
from __future__ import annotations

import functools
import time

import torch


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, batch: int,
                   bytes_per_elem: float) -> float:
    """2 (K and V) × layers × kv_heads × head_dim × seq_len × batch × bytes per element."""
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_elem


def decode_step_lower_bound(bytes_per_step: float, bandwidth: float) -> float:
    """Seconds: a step cannot finish faster than the time to stream its bytes from memory."""
    return bytes_per_step / bandwidth


def step_cost(weight_bytes: int, params_per_token: int, head_params: int, kv_bytes_per_token: int,
              seqs: list[tuple[int, int, int]], num_layers: int, num_heads: int, head_dim: int) -> dict:
    """Estimated bytes moved and FLOPs of one forward.

    seqs: (start_pos, new_tokens, logits_rows) per sequence.
    """
    tokens = sum(n for _, n, _ in seqs)
    logit_rows = sum(r for _, _, r in seqs)
    ctx_read = sum(start + n for start, n, _ in seqs)
    kv_read = kv_bytes_per_token * ctx_read
    kv_write = kv_bytes_per_token * tokens
    matmul_flops = 2 * (params_per_token - head_params) * tokens + 2 * head_params * logit_rows
    # QK^T and PV: 2 matmuls × 2 FLOPs × head_dim per (query, visible key) pair, in every head and layer.
    pairs = sum(n * start + n * (n + 1) // 2 for start, n, _ in seqs)
    attn_flops = 4 * num_layers * num_heads * head_dim * pairs
    total_bytes = weight_bytes + kv_read + kv_write
    flops = matmul_flops + attn_flops
    return {
        "tokens": tokens,
        "weight_bytes": weight_bytes,
        "kv_read_bytes": kv_read,
        "kv_write_bytes": kv_write,
        "bytes": total_bytes,
        "flops": flops,
        "intensity": flops / total_bytes if total_bytes else 0.0,
    }


@functools.lru_cache(maxsize=None)
def measure_bandwidth(device: str = "cpu", mbytes: int = 512, repeats: int = 7) -> float:
    """Read bandwidth in bytes/s: a reduction over a buffer far larger than any cache, best of `repeats`.

    A read stream is what a decode step does to its weights, so this is the roofline's memory slope.
    (A copy would count writes too and, with streaming stores, report a rate no weight read can reach.)
    """
    n = mbytes * 1024 * 1024 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        src.sum()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return src.numel() * 4 / best


@functools.lru_cache(maxsize=None)
def measure_peak_flops(device: str = "cpu", n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a square fp32 matmul, best of `repeats` (an achievable peak, not the datasheet's)."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    elif str(device).startswith("mps"):
        torch.mps.synchronize()


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Speculative decoding: mean tokens per target pass, (1 − α^(k+1)) / (1 − α)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)
