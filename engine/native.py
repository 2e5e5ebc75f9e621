"""The lab's own CPU kernels (engine/csrc/decode_kernels.cpp), built on first use with the machine's C++ compiler
and kept in a cache: one-row matmuls over q4 and int8 weights with integer dot products, and over fp32 and bf16
weights as one stream per core; and four fused small ops of a decode step (rms_norm, rope_store,
decode_attention, silu_mul).

Why compiled kernels: torch's weight-only kernels widen each weight to float before multiplying; at one row a
q4 decode step then does arithmetic at 8-18 GB/s of weights, far below the memory's speed (issue 14); and a
step's ~1,000 small torch ops cost microseconds of dispatch each. The C++ file's header says how the integer
path works and what it rounds. Model.native_ops turns the small ops on for float32 CPU models.

Built for this machine (`-march=native`, so the cache key holds the CPU's flags) into INFERLAB_CACHE (default
~/.cache/inferlab)/native/. Where there is no compiler, or INFERLAB_NATIVE=0, `available()` is False and the
formats run torch's kernels: slower, never wrong. engine/kernels.py offers these kernels as candidates and keeps
them only where they measure faster.

The ops' schemas are defined here, at import, so engine/scripted.py can compile calls to them whether or not
the library is ever built (a call before it is loaded fails, and none is made: no Kernel uses them then).
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("csrc") / "decode_kernels.cpp"
BUILD_TIMEOUT_S = 600

_lib = torch.library.Library("inferlab", "DEF")
_lib.define("q4_linear(Tensor x, Tensor rows) -> Tensor")
_lib.define("i8_linear(Tensor x, Tensor rows) -> Tensor")
_lib.define("f32_linear(Tensor x, Tensor w) -> Tensor")
_lib.define("bf16_linear(Tensor x, Tensor w) -> Tensor")
_lib.define("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor")
_lib.define("rope_store(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor slots, "
            "int heads, int kv_heads, Tensor? q_norm=None, Tensor? k_norm=None, float eps=0.) -> Tensor")
_lib.define("silu_mul(Tensor gu) -> Tensor")
_lib.define("decode_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor slots, Tensor lengths, float scale, "
            "int window=0) -> Tensor")
_lib.define("decode_layers(Tensor x, Tensor cos, Tensor sin, Tensor new_slots, Tensor(a!)[] k_pools, "
            "Tensor(b!)[] v_pools, Tensor[] in_norm, Tensor[] post_norm, int[] kinds, Tensor[] weights, "
            "Tensor?[] aux, Tensor?[] biases, int[] dims, float eps, float scale, Tensor slots, Tensor lengths, "
            "Tensor[] q_norm, Tensor[] k_norm, int[] windows) -> Tensor")

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict = {}  # "path": the loaded library, or "error": why there is none


def cache_dir() -> Path:
    root = os.environ.get("INFERLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "inferlab")
    return Path(root) / "native"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _command(out: Path) -> list[str]:
    from torch.utils import cpp_extension

    libs = cpp_extension.library_paths()
    cmd = [os.environ.get("CXX", "g++"), "-O3", "-march=native", "-std=c++17", "-fPIC", "-shared", "-fopenmp",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", "-w"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    # torch ships its own libgomp.so.1: linked by that name, the library joins torch's OpenMP runtime (and team)
    cmd += [str(SOURCE), *[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs],
            "-ltorch_cpu", "-lc10", "-o", str(out)]
    return cmd


def _build() -> Path:
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), torch.__version__.encode(), sys.version.encode(),
                                     _cpu_flags().encode(), " ".join(_command(Path("x"))).encode()]))
    out = cache_dir() / f"decode_kernels-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    compiler = _command(out)[0]
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: {compiler!r} is not on this machine ($CXX names another)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:  # one process builds; the others wait and load its result
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            tmp = out.with_suffix(f".{os.getpid()}.tmp")
            _log.warning("building the lab's CPU kernels (once per machine, 15-50 s on 2 cores): %s", out)
            done = subprocess.run(_command(tmp), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            if done.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise RuntimeError(f"the C++ build failed: {done.stderr.strip()[-2000:]}")
            os.replace(tmp, out)
    return out


def available() -> bool:
    """Whether the kernels are loaded (building them first if needed); False, with the reason in `status()`,
    where they cannot be built."""
    with _lock:
        if not _state:
            if os.environ.get("INFERLAB_NATIVE", "1") == "0":
                _state["error"] = "switched off (INFERLAB_NATIVE=0)"
            else:
                try:
                    path = _build()
                    torch.ops.load_library(str(path))
                    _state["path"] = path
                except Exception as exc:  # noqa: BLE001 - no compiler, a failed build: torch's kernels remain
                    _state["error"] = f"{type(exc).__name__}: {exc}"
                    _log.warning("the lab's CPU kernels are unavailable (%s); using torch's", _state["error"])
        return "path" in _state


def status() -> str:
    """One line for --stats: the instruction set the kernels were built for, or why there are none."""
    if not available():
        return f"not built: {_state['error']}"
    return f"built for {torch.ops.inferlab_native.isa()} ({_state['path'].name})"


def q4_rows(codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 20 * K/32], the q4 kernel's layout (decode_kernels.cpp, q4_group), from codes [N, K] in 0..15 and
    per-block scale d and low m [N, K/32] (w = d * code + m): output rows in groups of 16 (N a multiple of 16);
    per group and block of 32 columns, 4 x 64 code bytes, byte (v, i, t) holding row i's code 4v + t in its low
    nibble and code 16 + 4v + t in its high one, then the 16 rows' d and their m as fp16. The same 20 bytes per 32
    weights as the GGUF, a group's bytes together; `q4_unpack` reverses it exactly."""
    n, k = codes.shape
    if n % 16 or k % 32:
        raise ValueError(f"q4 rows need N a multiple of 16 and K of 32, not {n} x {k}")
    g = k // 32
    c = codes.to(torch.uint8).reshape(n // 16, 16, g, 2, 4, 4)  # (group, row i, block, half, v, t)
    packed = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4).reshape(n // 16, g, 256)

    def per_group(t):  # [N, G] fp16 -> (group, block, 16 rows) as bytes
        return t.half().reshape(n // 16, 16, g).transpose(1, 2).contiguous().view(torch.uint8)

    return torch.cat([packed, per_group(scale), per_group(low)], dim=2).reshape(n, 20 * g).contiguous()


def q4_unpack(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K], d float32 [N, K/32], m float32 [N, K/32]) from `q4_rows`'s layout."""
    n, g = rows.shape[0], rows.shape[1] // 20
    blocks = rows.reshape(n // 16, g, 320)
    b = blocks[:, :, :256].reshape(n // 16, g, 4, 16, 4).permute(0, 3, 1, 2, 4)  # (group, row i, block, v, t)
    codes = torch.stack([b & 0x0F, b >> 4], dim=3).reshape(n, g * 32)

    def rows_of(t):  # (group, block, 32 bytes) -> [N, G] float32
        return t.contiguous().view(torch.float16).transpose(1, 2).reshape(n, g).float()

    return codes, rows_of(blocks[:, :, 256:288]), rows_of(blocks[:, :, 288:])


def i8_rows(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K + 2], the int8 kernel's layout (decode_kernels.cpp, i8_group), from torch's int8 tensors: codes
    int8 [N, K] (-127..127) and bf16 row scales [N]: output rows in groups of 16 (N a multiple of 16); per group and
    block of 32 columns, 8 x 64 bytes, byte (v, i, t) = row i's code 4v + t + 128, then the group's 16 bf16
    scales. The same bytes as torch's tensors, a group's together; `i8_unpack` reverses it exactly."""
    n, k = codes.shape
    if n % 16 or k % 32:
        raise ValueError(f"int8 rows need N a multiple of 16 and K of 32, not {n} x {k}")
    g = k // 32
    offset = (codes.to(torch.int16) + 128).to(torch.uint8).reshape(n // 16, 16, g, 8, 4)  # (group, i, block, v, t)
    blocks = offset.permute(0, 2, 3, 1, 4).reshape(n // 16, g * 512)
    scales = scale.to(torch.bfloat16).reshape(n // 16, 16).contiguous().view(torch.uint8)
    return torch.cat([blocks, scales], dim=1).reshape(n, k + 2).contiguous()


def i8_unpack(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [N, K], scale bf16 [N]) from `i8_rows`'s layout."""
    n, k = rows.shape[0], rows.shape[1] - 2
    g = k // 32
    grouped = rows.reshape(n // 16, g * 512 + 32)
    b = grouped[:, : g * 512].reshape(n // 16, g, 8, 16, 4).permute(0, 3, 1, 2, 4).reshape(n, k)
    codes = (b.to(torch.int16) - 128).to(torch.int8)
    return codes, grouped[:, g * 512:].contiguous().view(torch.bfloat16).reshape(n)


def pack(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `tensors` (contiguous, each 64-byte aligned) laid end to end, in this order, in one buffer of
    2 MB-aligned memory advised for transparent huge pages (decode_kernels.cpp, huge_buffer). Given the matrices a
    decode step reads in the order it reads them, the weights become one stream: the prefetchers run on from
    one matrix into the next, and ~50x fewer pages mean as many fewer TLB misses. In-process, 30 layers' q4
    matrices from memory took 0.80-0.85x the time of separately allocated ones here."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    starts, end = [], 0
    for n in sizes:
        starts.append(end)
        end += -(-n // 64) * 64
    buffer = torch.ops.inferlab_native.huge_buffer(max(end, 1))
    out = []
    for t, start, n in zip(tensors, starts, sizes):
        view = buffer[start : start + n].view(t.dtype).view(t.shape)
        view.copy_(t)
        out.append(view)
    return out

