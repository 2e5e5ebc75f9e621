"""Weight formats and the matmul kernels that run them, chosen by measurement on the machine at hand.

A decode step reads every weight once to produce a handful of rows: it is a memory stream, and the bytes per
weight set its speed. Four formats of the same model:

  fp32  the reference (parity with transformers). Kernels: MKL `F.linear`, or a oneDNN-packed copy, or at one
        row the lab's own (engine/native.py: one weight stream per core, 2x MKL's gemv here).
  bf16  half the bytes. Kernels: `F.linear` or oneDNN-packed, on bf16 weights, or at one row the lab's own
        (float32 arithmetic on the exactly widened weights).
  int8  weight-only, one scale per output channel (symmetric): `aten._weight_int8pack_mm`, or at one row the
        lab's own kernel over the same codes (engine/native.py).
  q4    weight-only int4 in groups of 32 along the input, a scale and a zero per group:
        `aten._weight_int4pack_mm_for_cpu`, or at one row the lab's own kernel over the Q4_1 blocks as the file
        stores them. For the bundled model these are the GGUF file's own Q4_1 codes (engine/quant.py), not a
        re-quantization of the dequantised floats.

Only the matmul sees the format: activations, norms, attention and the KV pool stay float32. torch's quantized
kernels and bf16 take bf16 activations (torch's int4/int8 CPU kernels are fast only then: ~50x slower with
float32 inputs), so the input row is cast to bf16 at the matmul and the result back to float32. The lab's own
kernels for one row (engine/native.py: integer dot products, as llama.cpp computes) take float32 rows and
quantize them per block of 32 themselves.

Which kernel is fastest is a property of the machine, not of the format: the docstring of an older version
said oneDNN beat MKL by 40 % at batch 1 (measured on one machine); on another MKL won by 20 %. So at load each
candidate is timed on the model's own matrices (`choose`), once per format and shape per process, and the
fastest kept; `Linear.describe()` says what runs where (`python -m engine ... --stats` prints it).
Three input sizes are timed apart, because the winners differ: one row (a single sequence's decode step), a
decode batch (2 to DECODE_MAX_ROWS rows: a room's step, a verification of k drafts; timed at 16) and prefill
(timed at PREFILL_ROWS). The lab's one-row kernels win at one row but lose 2-4x at 16, and the quantized
kernels lose 2x at 16-32 rows and 5-20x at 128 to a bf16 copy, which decode batches and prefill then use (its
memory is the price). Candidates are timed with the caches emptied first (`_EVICT_BYTES`), as a decode step
meets them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from . import native, scripted

FORMATS = ("fp32", "bf16", "int8", "q4")
DECODE_MAX_ROWS = 32  # a decode batch (a room of twenty tabs), or one verification of k drafts
PREFILL_ROWS = 128  # the row count prefill kernels are timed at
CLEAR_WIN = 0.9  # another candidate than the first is chosen only below this fraction of the first's time
GROUP = 32  # q4's group size along the input dimension (GGUF Q4_1's block)
KIND_NAMES = {scripted.MKL: "MKL F.linear", scripted.ONEDNN: "oneDNN packed", scripted.INT8: "int8 weight-only",
              scripted.INT4: "int4 g32 weight-only", scripted.NATIVE_Q4: "q4 integer dots (the lab's)",
              scripted.NATIVE_I8: "int8 integer dots (the lab's)", scripted.NATIVE_F32: "fp32 row streams (the lab's)",
              scripted.NATIVE_BF16: "bf16 row streams (the lab's)"}
PHASES = ("single", "decode", "prefill")  # the input sizes timed apart: 1 row, a decode batch, a prefill
PHASE_ROWS = ((1,), (16,), (PREFILL_ROWS,))


@dataclass
class Kernel:
    """One way to compute x @ W.T: the kernel (scripted.MKL...), the tensors it reads, and their bytes."""

    kind: int
    weight: torch.Tensor
    aux: Optional[torch.Tensor] = None  # int8: per-channel scales; int4: scales and zeros per group

    @property
    def nbytes(self) -> int:
        aux = 0 if self.aux is None else self.aux.numel() * self.aux.element_size()
        return self.weight.numel() * self.weight.element_size() + aux

    @property
    def name(self) -> str:
        dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.weight.dtype, "")
        return KIND_NAMES[self.kind] + (f" {dtype}" if self.kind in (scripted.MKL, scripted.ONEDNN) else "")


class Linear:
    """y = x @ W.T (+ b) with the kernel measured fastest for one row, for a decode batch and for a prefill."""

    def __init__(self, kerns: tuple[Kernel, Kernel, Kernel], bias: torch.Tensor | None, shape: tuple[int, int],
                 fmt: str):
        self.single, self.decode, self.prefill = kerns
        self.bias = bias
        self.out_features, self.in_features = shape
        self.fmt = fmt
        self.decode_invariant = False  # set by `build`: a row's result does not depend on the rows beside it
        # the weights as the model defines them (multiply-accumulates per token), whatever their storage
        self.numel = shape[0] * shape[1] + (0 if bias is None else bias.numel())

    def kernel(self, rows: int, prefer_decode: bool = False) -> Kernel:
        return self.single if rows == 1 else self.decode if prefer_decode or rows <= DECODE_MAX_ROWS else self.prefill

    def __call__(self, x: torch.Tensor, prefer_decode: bool = False) -> torch.Tensor:
        k = self.kernel(x.shape[0], prefer_decode)
        return scripted.matmul(x, k.kind, k.weight, k.aux, self.bias)

    @property
    def nbytes(self) -> int:
        """What a single sequence's decode step reads of this matrix."""
        return self.single.nbytes + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())

    def describe(self) -> dict:
        return {"format": self.fmt, "single": self.single.name, "decode": self.decode.name,
                "prefill": self.prefill.name}


# ---- building a format's candidates -----------------------------------------------------------------------
def _onednn(w: torch.Tensor) -> Kernel | None:
    try:
        if w.device.type == "cpu" and torch.backends.mkldnn.is_available():
            return Kernel(scripted.ONEDNN, torch.ops.mkldnn._reorder_linear_weight(w))
    except (RuntimeError, AttributeError):  # no oneDNN in this build, or not for this dtype
        pass
    return None


def int8_per_channel(w: torch.Tensor) -> Kernel:
    """Symmetric int8 with one scale per output row: the row's largest |w| maps to 127."""
    scale = (w.abs().amax(dim=1).float() / 127).clamp_min(torch.finfo(torch.float32).tiny)
    codes = torch.round(w.float() / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return Kernel(scripted.INT8, codes, scale.to(torch.bfloat16))


def int4_groups(codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> Kernel:
    """codes [N, K] in 0..15, scale and low [N, K/32]: w = scale * code + low (GGUF Q4_1's form). torch's kernel
    computes (code - 8) * scale + zero, so zero = low + 8 * scale; its scales and zeros are bf16."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    zero = low.float() + 8 * scale.float()
    scales_and_zeros = torch.stack([scale.float().t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
    return Kernel(scripted.INT4, packed, scales_and_zeros)


def native_q4(codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> Kernel:
    """The lab's q4 kernel over the GGUF blocks as they are: code bytes, and each row's fp16 d and m values."""
    return Kernel(scripted.NATIVE_Q4, native.q4_rows(codes, scale, low))


def native_i8(k: Kernel) -> Kernel:
    """The lab's int8 kernel over the codes and bf16 row scales of torch's (`int8_per_channel`), regrouped 16 rows
    at a time (a copy: torch's kernel keeps its own layout for batches and prefill)."""
    return Kernel(scripted.NATIVE_I8, native.i8_rows(k.weight, k.aux))


def candidates(fmt: str, w: torch.Tensor, q4: tuple | None = None) -> tuple[list[Kernel], ...]:
    """(one-row, decode-batch, prefill candidates) of one matrix in `fmt`; w is its float32 weight (for q4, the
    dequantised one; q4 carries the codes, scales and lows)."""
    # the lab's kernels take float32 rows: a model of bf16 or fp16 activations (its weights cast alike) runs torch's
    own = native.available() and w.device.type == "cpu" and w.dtype == torch.float32
    if fmt == "fp32":
        plain = Kernel(scripted.MKL, w.contiguous())
        decode = [plain] + [k for k in [_onednn(plain.weight)] if k]
        # prefill keeps MKL: the kernel transformers uses, so prompt logits match the reference to ~1e-5
        return [Kernel(scripted.NATIVE_F32, plain.weight)] * own + decode, decode, [plain]
    half = w.to(torch.bfloat16).contiguous()
    bf16 = [Kernel(scripted.MKL, half)] + [k for k in [_onednn(half)] if k]
    if fmt == "bf16":
        return [Kernel(scripted.NATIVE_BF16, half)] * own + bf16, bf16, bf16
    if w.device.type != "cpu":
        raise ValueError(f"weights={fmt!r} runs on CPU only (its kernels are torch's CPU ones)")
    quant = int8_per_channel(w) if fmt == "int8" else int4_groups(*q4)
    # the lab's integer kernels take 16 output rows at a time and blocks of 32 columns
    grouped = w.shape[0] % 16 == 0 and w.shape[1] % 32 == 0
    mine = [native_i8(quant) if fmt == "int8" else native_q4(*q4)] if own and grouped else []
    # the bf16 copy prefill needs anyway is also a decode-batch candidate: at 16-32 rows oneDNN's bf16 kernel
    # took half the time of torch's int4 one here (a room's step, a prompt of up to DECODE_MAX_ROWS tokens)
    return mine + [quant], [quant] + bf16, [quant] + bf16


# ---- choosing by measurement --------------------------------------------------------------------------------
_chosen: dict[tuple, int] = {}  # (format, phase, shape, row count) -> index of the fastest candidate


def choose(key: tuple, options: list[list[Kernel]], rows: tuple[int, ...], in_features: int, reps: int = 5) -> int:
    """Index of the fastest option (each: the same candidate kind for several matrices) over inputs of each row
    count in `rows` (summed), timed interleaved; remembered for the process, so every model of one format runs
    the same kernels. Another option than the first must be clearly faster (CLEAR_WIN) to be chosen. An option
    over 3x the fastest after one timed pass is not timed again (the int8 kernel takes ~0.3 s for a 128-row
    head)."""
    if key not in _chosen:
        device = options[0][0].weight.device
        xs = [torch.randn(n, in_features, device=device) for n in rows]
        best = [float("inf")] * len(options)
        alive = list(range(len(options))) if len(options) > 1 else []
        # freed when this call ends (64 MB kept for the process would be a memory cost on a small Space)
        evictor = torch.ones(_EVICT_BYTES // 4) if alive and device.type == "cpu" else None
        for rep in range(reps + 1):  # the first pass warms up (packing, allocation, paging in): not counted
            for i in alive:
                if evictor is not None:
                    evictor.sum()  # the caches emptied: see _EVICT_BYTES
                t = time.perf_counter()
                for x in xs:
                    _run_all(options[i], x)
                if rep:
                    best[i] = min(best[i], time.perf_counter() - t)
            if rep == 1:
                alive = [i for i in alive if best[i] <= 3 * min(best)]
        fastest = min(range(len(options)), key=best.__getitem__) if alive else 0
        # a near-tie goes to the first candidate, so a format's kernels (and so its numbers: the lab's q4 kernel
        # and torch's round the activations differently) do not flip from run to run with the machine's noise
        _chosen[key] = fastest if best[fastest] < CLEAR_WIN * best[0] else 0
    return _chosen[key]


# Before each timed pass `choose` reads a buffer this large (twice the largest last-level cache of these
# machines, 32 MB), so the candidates read their weights from memory, as a decode step does (it streams every
# matrix once). Timed with warm caches, a layer's 10 MB of q4 weights fit in L3 and the arithmetic-bound kernel
# won; in the step the other one was 1.6x faster.
_EVICT_BYTES = 64 << 20


def _run_all(kernels: list[Kernel], x: torch.Tensor) -> None:
    for k in kernels:
        scripted.matmul(x, k.kind, k.weight, k.aux, None)


def build(fmt: str, weights: list[torch.Tensor], biases: list[torch.Tensor | None], name: str,
          q4: list[tuple] | None = None, measure: bool = True) -> list[Linear]:
    """Linear layers for matrices of one shape (e.g. every layer's o_proj), each with the kernels measured
    fastest for that shape at each of PHASES (MKL's fp32 gemm wins at one row on one thread here and reads at
    a third of oneDNN's speed at eight rows). measure=False keeps the first candidate of each."""
    if fmt not in FORMATS:
        raise ValueError(f"weights must be one of {', '.join(FORMATS)} (got {fmt!r})")
    cands = [candidates(fmt, w, None if q4 is None else q4[i]) for i, w in enumerate(weights)]
    shape = tuple(weights[0].shape)
    picks = []
    for phase, rows in enumerate(PHASE_ROWS):
        per_kind = [[c[phase][j] for c in cands] for j in range(len(cands[0][phase]))]
        picks.append(choose((fmt, name, phase, shape), per_kind, rows, shape[1]) if measure else 0)
    out = [Linear(tuple(c[p][picks[p]] for p in range(len(PHASES))), b, shape, fmt) for c, b in zip(cands, biases)]
    invariant = _batch_invariant(out[0])
    for lin in out:
        lin.decode_invariant = invariant
    return out


def _batch_invariant(lin: Linear) -> bool:
    """Whether a row gets the same bits alone as among other decode-sized rows (MKL's fp32 gemm gives it other
    bits: one row takes its gemv path; so does a one-row kernel other than the batch one). Checked, not
    assumed: the logit lens shares the head's pass with the real logits only where it cannot change them."""
    x = torch.randn(DECODE_MAX_ROWS, lin.in_features, device=lin.decode.weight.device)
    full = lin(x, prefer_decode=True)
    return all(torch.equal(lin(x[:n], prefer_decode=True), full[:n]) for n in (1, 2, 3, 5, 8))
