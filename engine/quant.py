"""The bundled GGUF's own 4-bit weights, read as codes, scales and lows (for weights="q4", engine/kernels.py).

A Q4_1 block holds 32 consecutive weights of one row: a float16 scale d, a float16 low m and 32 four-bit codes
q (byte j: code j in its low nibble, code j + 16 in its high one); w = d * q + m. That is exactly an int4 group
of 32 with a scale and a zero, so the 4-bit path runs the very weights the model ships with: unpacked, they
equal transformers' dequantised float32 weights bit for bit (tests/test_weights.py).

llama.cpp's converter permutes the rows of q_proj and k_proj (its rotary embedding pairs neighbouring
dimensions, the checkpoints pair halves); the rows are put back as transformers does when it dequantises.
Groups run along a row, so a row permutation moves whole blocks and changes no code.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

BLOCK = 32
_Q4_1_BYTES = 20  # float16 d, float16 m, 16 bytes of codes
_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}


class NoQ4Weights(ValueError):
    """The model has no Q4_1 weights to run as q4."""


def unpack_q4_1(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """raw: uint8 [rows, cols / 32 * 20] -> (codes uint8 [rows, cols], scale float32 [rows, cols / 32], low)."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // BLOCK, _Q4_1_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., 4:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, cols)
    return torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(m)


def dequantise(codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """w = d * q + m per group, in float32, as the GGUF reader computes it."""
    rows, cols = codes.shape
    q = codes.view(rows, cols // BLOCK, BLOCK).float()
    return (scale[..., None] * q + low[..., None]).view(rows, cols)


def _unpermute(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's row order of q_proj/k_proj (per head: interleaved pairs -> two halves)."""
    rows = t.shape[0]
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def read_q4_1(path: Path, num_heads: int, num_kv_heads: int, cache: Path | None = None) -> dict[str, tuple]:
    """{checkpoint name: (codes, scale, low)} of every Q4_1 projection in the GGUF file at `path`. With `cache`
    (a .safetensors path), read from there when it exists, else written there: parsing the GGUF's metadata
    (its tokenizer's 49,152 tokens and merges) takes most of ~10 s; the cache reads in well under one."""
    from safetensors.torch import load_file, save_file

    if cache is not None and cache.exists():
        flat = load_file(str(cache))
        return {name[: -len(".codes")]: (flat[name], flat[name[:-6] + ".scale"], flat[name[:-6] + ".low"])
                for name in flat if name.endswith(".codes")}
    out = _parse(path, num_heads, num_kv_heads)
    if cache is not None:
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")  # two processes may write it at once
        save_file({f"{name}.{part}": t.contiguous() for name, parts in out.items()
                   for part, t in zip(("codes", "scale", "low"), parts)}, str(tmp))
        tmp.rename(cache)
    return out


def _parse(path: Path, num_heads: int, num_kv_heads: int) -> dict[str, tuple]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        parts = t.name.split(".")  # blk.<i>.<kind>.weight
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _NAMES:
            continue
        if t.tensor_type.name != "Q4_1":
            raise NoQ4Weights(f"{t.name} is stored as {t.tensor_type.name}, not Q4_1")
        cols, rows = (int(n) for n in t.shape)  # GGUF lists the fastest-varying dimension first
        codes, scale, low = unpack_q4_1(np.asarray(t.data), rows, cols)
        if parts[2] in ("attn_q", "attn_k"):
            heads = num_heads if parts[2] == "attn_q" else num_kv_heads
            codes, scale, low = (_unpermute(x, heads) for x in (codes, scale, low))
        out[f"model.layers.{parts[1]}.{_NAMES[parts[2]]}.weight"] = (codes, scale, low)
    if not out:
        raise NoQ4Weights(f"{path.name} has no Q4_1 projection weights")
    return out
