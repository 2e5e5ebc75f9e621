"""Timings, bytes and FLOPs per step, this machine's measured roofline, and the whiteboard formulas.

A decode step must read every weight once, so at batch 1 its time is bounded below by
weight_bytes / memory_bandwidth; that bound, and how close a measured step comes to it, is the roofline
story the lab tells. The estimates here count the big terms only: weights, K/V read and written, and the
matmul/attention FLOPs. Activations are ignored (they are kilobytes next to hundreds of megabytes).
"""
from __future__ import annotations

import functools
import math
import numbers
import time
from dataclasses import dataclass

import torch

from . import compute
from .records import Record


@dataclass
class StepTiming(Record):
    """Measured wall-clock time of one engine step, phase by phase, and the engine clock after it."""

    schedule_ms: float
    draft_ms: float  # speculative drafters (0 without speculating sequences)
    forward_ms: float  # the model's one forward over the batch
    sample_ms: float  # sampling or verifying, and settling the KV blocks
    step_ms: float
    engine_clock_s: float  # the sum of every step's duration so far: TTFT and ITL are read on this clock
    grammar_ms: float = 0.0  # building grammar masks (engine/grammar.py), every sequence's; a part of sample_ms


@dataclass
class StepCost(Record):
    """Estimated bytes moved and FLOPs of one forward (`step_cost`). Counts are floats where the whiteboard
    calculators pass fractional bytes per weight; the engine's own are whole numbers."""

    tokens: int  # tokens whose K/V the forward computed
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    bytes: float  # weights + K/V read + K/V written
    flops: float
    intensity: float  # FLOPs per byte


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, batch: int,
                   bytes_per_elem: float) -> float:
    """2 (K and V) × layers × kv_heads × head_dim × seq_len × batch × bytes per element."""
    _int("n_layers", n_layers, 1)
    _int("n_kv_heads", n_kv_heads, 1)
    _int("head_dim", head_dim, 1)
    _int("seq_len", seq_len, 0)
    _int("batch", batch, 0)
    _real("bytes_per_elem", bytes_per_elem, 0, strict=True)
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_elem


def decode_step_lower_bound(bytes_per_step: float, bandwidth: float) -> float:
    """Seconds: a step cannot finish faster than the time to stream its bytes from memory.

    bytes_per_step in bytes, bandwidth in bytes/s.
    """
    _real("bytes_per_step", bytes_per_step, 0)
    _real("bandwidth", bandwidth, 0, strict=True)
    return bytes_per_step / bandwidth


def step_cost(weight_bytes: int, params_per_token: int, head_params: int, kv_bytes_per_token: int,
              seqs: list[tuple[int, int, int]], num_layers: int, num_heads: int, head_dim: int) -> StepCost:
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
    return StepCost(tokens=tokens, weight_bytes=weight_bytes, kv_read_bytes=kv_read, kv_write_bytes=kv_write,
                    bytes=total_bytes, flops=flops, intensity=flops / total_bytes if total_bytes else 0.0)


@functools.lru_cache(maxsize=None)
@compute.routed
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
@compute.routed
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
    """Speculative decoding: mean tokens per target pass, (1 − α^(k+1)) / (1 − α).

    α is the per-token acceptance rate (assumed independent per position), k the draft length. The sum
    1 + α + … + α^k counts the bonus/replacement token the target always contributes, so α = 1 gives k + 1
    and α = 0 gives 1 (a pass never yields less than a plain decode step).
    """
    _real("alpha", alpha, 0)
    if alpha > 1:
        raise ValueError(f"alpha is an acceptance rate in [0, 1] (got {alpha!r})")
    _int("k", k, 0)
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def speculative_speedup(alpha: float, k: int, c: float) -> float:
    """E / (1 + k·c): tokens per pass over the cost of one pass, in units of a plain target decode step.

    c is the cost of one draft token relative to one target step; the verify pass is counted as one target
    step (the k extra positions ride along, which holds while decode is memory-bound).
    """
    _real("c", c, 0)
    return expected_tokens_per_pass(alpha, k) / (1 + k * c)


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOP per byte moved to/from memory."""
    _real("flops", flops, 0)
    _real("bytes", bytes_moved, 0, strict=True)
    return flops / bytes_moved


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the roof bends: below it a kernel is memory-bound, above compute-bound."""
    _real("peak_flops", peak_flops, 0, strict=True)
    _real("bandwidth", bandwidth, 0, strict=True)
    return peak_flops / bandwidth


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roof: min(peak, bandwidth × intensity) FLOP/s."""
    _real("intensity", intensity, 0)
    _real("peak_flops", peak_flops, 0, strict=True)
    _real("bandwidth", bandwidth, 0, strict=True)
    return min(peak_flops, bandwidth * intensity)


def weight_bytes(n_params: float, bytes_per_elem: float) -> float:
    """Bytes the weights occupy at a given storage width (int4 = 0.5; quantisation scales are ignored)."""
    _real("n_params", n_params, 0)
    _real("bytes_per_elem", bytes_per_elem, 0, strict=True)
    return n_params * bytes_per_elem


# vLLM's default gpu_memory_utilization is 0.9: the remaining tenth is left for the CUDA context, activations
# and allocator fragmentation. The same share is the default here.
DEFAULT_RESERVE_FRACTION = 0.1


def max_concurrent_sequences(gpu_bytes: float, weight_bytes: float, kv_bytes_per_seq: float,
                             reserve_fraction: float = DEFAULT_RESERVE_FRACTION) -> int:
    """How many sequences' full KV cache fit beside the weights: ⌊(M·(1 − r) − W) / KV_seq⌋, at least 0.

    Assumptions: one device holds all the weights (no tensor parallelism); a fraction r of its memory is
    kept for activations, the runtime and fragmentation; every sequence reserves its whole context.
    """
    _real("gpu_bytes", gpu_bytes, 0)
    _real("weight_bytes", weight_bytes, 0)
    _real("kv_bytes_per_seq", kv_bytes_per_seq, 0, strict=True)
    _real("reserve_fraction", reserve_fraction, 0)
    if reserve_fraction >= 1:
        raise ValueError(f"reserve_fraction must be below 1 (got {reserve_fraction!r})")
    free = gpu_bytes * (1 - reserve_fraction) - weight_bytes
    return max(0, math.floor(free / kv_bytes_per_seq))


def llama_param_counts(num_layers: int, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                       intermediate_size: int, vocab_size: int, tie_word_embeddings: bool = False,
                       qkv_bias: bool = False) -> dict:
    """Parameter counts of a Llama-family decoder (GQA attention, SwiGLU MLP, RMSNorm) from its config.

    total: every parameter (what the weights occupy in memory);
    per_step: what one forward must stream (the input embedding table is gathered a row at a time, so an
        untied table is not read in full; a tied one is, as the LM head) — Model.weight_bytes_per_step / elem;
    matmul: parameters in matrix multiplies, head included (FLOPs per token ≈ 2 × this) — Model.params_per_token.
    """
    for name, v in (("num_layers", num_layers), ("hidden_size", hidden_size), ("num_heads", num_heads),
                    ("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("intermediate_size", intermediate_size),
                    ("vocab_size", vocab_size)):
        _int(name, v, 1)
    h, q, kv = hidden_size, num_heads * head_dim, num_kv_heads * head_dim
    attn = h * q + 2 * h * kv + q * h
    mlp = 3 * h * intermediate_size
    bias = (q + 2 * kv) if qkv_bias else 0
    norms = 2 * h
    layer_matmul = attn + mlp
    embed = vocab_size * h
    head = 0 if tie_word_embeddings else embed
    total = embed + head + num_layers * (layer_matmul + bias + norms) + h
    per_step = embed + num_layers * (layer_matmul + bias + norms) + h  # the head (= embed when tied) + layers
    matmul = embed + num_layers * layer_matmul
    return {"total": total, "per_step": per_step, "matmul": matmul, "head": embed}


def _real(name: str, v, minimum: float, strict: bool = False) -> None:
    """A finite real number ≥ minimum (> minimum when strict); bools are rejected (True is not a size)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
        raise ValueError(f"{name} must be a finite number (got {v!r})")
    if v < minimum or (strict and v == minimum):
        raise ValueError(f"{name} must be {'>' if strict else '≥'} {minimum} (got {v!r})")


def _int(name: str, v, minimum: int) -> None:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):  # numpy integers count, True does not
        if isinstance(v, float) and v.is_integer():
            raise ValueError(f"{name} must be an integer, not a float (got {v!r})")
        raise ValueError(f"{name} must be an integer (got {v!r})")
    if v < minimum:
        raise ValueError(f"{name} must be ≥ {minimum} (got {v!r})")
