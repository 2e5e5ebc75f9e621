"""Our own Llama-family forward pass in plain PyTorch, reading K/V from the paged pool.

One forward call processes a *flat batch*: the new tokens of several sequences concatenated (prefill chunks
and single decode tokens mixed). Projections and the MLP run once over all rows; attention runs per sequence
(or as one padded call when every sequence decodes a single token), gathering each sequence's K/V from the
pool through its slots (block table → physical slots, computed by the scheduler).

The families differ in data the layers take, not in code paths: each layer's sliding window (Mistral's on every
layer, Qwen's from `max_window_layers` on; query i sees keys i - window < j <= i, transformers' mask: a mask on
the prefill and capture paths, a key range in the native decode attention), Qwen3's per-head q/k RMSNorm (applied
with the rotation, in rope_store), and the biases of whichever fused matrices the checkpoint has.

Weights are re-laid out once at load: q/k/v fused into one matrix and gate/up into another, so a layer makes
four weight reads instead of seven. Each matrix is stored in the chosen weight format (fp32, bf16, int8, q4)
and runs the kernel measured fastest for it on this machine, one for decode-sized and one for prefill-sized
inputs (engine/kernels.py). Batch-1 decode is purely memory-bound: the bytes per weight are the whole game.

Instrumentation (attention probabilities, logit lens, residual norms, embeddings) is computed only when a
`Capture` is passed for some sequence of the batch; without it the layers run as one TorchScript call
(engine/scripted.py: the same kernels without giving up Python's GIL ~1,500 times a step, which made a step
slow whenever the web app's threads were busy), with bitwise the same results.
"""
from __future__ import annotations

import contextlib
import functools
import math
import time
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import compute, kernels, native, scripted
from .governor import GOVERNOR
from .kernels import Linear


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position: int
    tie_word_embeddings: bool
    qkv_bias: bool
    sliding_window: int | None  # the window of the layers that have one (None: every layer sees the whole context)
    # each layer's sliding window: query i attends keys j with i - window < j <= i; 0: the whole context
    layer_windows: tuple[int, ...] = ()
    qk_norm: bool = False  # Qwen3: per-head RMSNorm of q and k (weights q_norm, k_norm) before RoPE

    @classmethod
    def from_config(cls, config) -> "ModelSpec":
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        rope = dict(getattr(config, "rope_parameters", None) or {})
        legacy = getattr(config, "rope_scaling", None)
        if legacy and not rope.get("rope_type"):
            rope.update(legacy)
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            from .loader import ModelLoadError

            raise ModelLoadError(f"RoPE type {rope_type!r} is not supported (default and llama3 are)")
        windows = _layer_windows(config)
        return cls(
            model_type=config.model_type,
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            rms_norm_eps=float(config.rms_norm_eps),
            rope_theta=float(theta),
            rope_scaling=rope if rope_type == "llama3" else None,
            max_position=int(getattr(config, "max_position_embeddings", 2048)),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
            sliding_window=max(windows) or None,
            layer_windows=windows,
            qk_norm=config.model_type == "qwen3",
        )

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _fused_bias(state: dict, prefix: str, parts: tuple[str, ...], read) -> torch.Tensor | None:
    """The biases of a fused matrix's parts, concatenated as their weights are (Qwen2's q/k/v; o_proj and the
    MLP's where a config asks for them); None where the checkpoint has none."""
    names = [prefix + part + ".bias" for part in parts]
    have = [n in state for n in names]
    if not any(have):
        return None
    if not all(have):
        from .loader import ModelLoadError

        raise ModelLoadError(f"the checkpoint has biases for some of {', '.join(names)} but not all")
    return torch.cat([read(n) for n in names])


def _layer_windows(config) -> tuple[int, ...]:
    """Each layer's sliding window, 0 where a layer attends to the whole context: Mistral's `sliding_window`
    holds for every layer; Qwen2/3 name each layer's kind in `layer_types` (sliding from `max_window_layers` on)
    and use a window only with `use_sliding_window`."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if config.model_type in ("qwen2", "qwen3") and not getattr(config, "use_sliding_window", False):
        window = None
    types = getattr(config, "layer_types", None)
    if types is not None:
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown:
            from .loader import ModelLoadError

            raise ModelLoadError(f"attention layer type(s) {', '.join(map(repr, unknown))} are not supported "
                                 "(full_attention and sliding_attention are)")
    if not window:
        return (0,) * n
    if types is None:
        return (int(window),) * n
    return tuple(int(window) if t == "sliding_attention" else 0 for t in types)


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """Inverse frequencies θ^(-2i/d), with Llama 3's piecewise rescaling when configured."""
    dim = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = spec.rope_scaling
    if s:
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old_len = s["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(medium, blended, scaled)
    return inv_freq


# The lab's attention budget per sequence and step (app/session.py passes it to every tab's Capture). Full
# capture of a 1,400-token prompt keeps 30 layers x 9 heads x T x T float32, ~1.4 GB per tab; 24 MiB keeps
# every layer and head for the last 16 query rows at T = 1,400 (45 rows of a 512-token first chunk), and a
# whole decode row up to a 23,000-token context.
ATTENTION_BUDGET = 24 << 20
# Above the budget, a layer's attention is computed in blocks of query rows of about this many bytes of
# scores, so the transient memory of the forward is bounded too (a few such blocks, not heads x T x T).
ATTENTION_BLOCK_BYTES = 8 << 20
# A block has at least this many rows: MKL gives a matmul of 1-3 rows (a gemv path) different last bits
# than the same rows inside a larger product; from 4 rows up the blocks reproduce the full product bitwise.
MIN_BLOCK_ROWS = 8
# The logit lens goes through the LM head and its vocab-wide softmax this many rows at a time (12 MB each).
LENS_BLOCK_ROWS = 64


@dataclass
class Capture:
    """What to record during one forward. Only rows of sequences listed in `seq_indices` (None = all)."""

    attention_layers: list[int] | None = None  # None: every layer
    attention_heads: list[int] | None = None  # None: every head
    attention: bool = True
    logit_lens: bool = True
    lens_top_k: int = 5
    lens_max_positions: int = 8  # the lens over a long prefill would cost L×T head matmuls: keep the tail
    residual_norms: bool = True
    embeddings: bool = True
    # Bytes of attention probabilities kept per sequence and step (None: unlimited). Above it only the last
    # query rows that fit are kept, for every recorded layer and head (so any layer/head can still be shown),
    # and SeqCapture.attention_positions says which; a row that alone exceeds it is not kept at all.
    max_attention_bytes: int | None = None


@dataclass
class SeqCapture:
    attention: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [heads, kept rows, ctx]
    attention_positions: list[int] | None = None  # absolute positions of the kept rows; None: every row
    lens_positions: list[int] = field(default_factory=list)  # absolute positions covered by the lens
    lens_ids: torch.Tensor | None = None  # [layers, positions, k]
    lens_probs: torch.Tensor | None = None  # [layers, positions, k]
    residual_norms: torch.Tensor | None = None  # [layers + 1, q_len]: after embedding, after each layer
    embeddings: torch.Tensor | None = None  # [q_len, hidden]


@dataclass
class SeqInput:
    """One sequence's part of a flat batch."""

    token_ids: list[int]  # new tokens whose K/V this forward writes
    start_pos: int  # absolute position of token_ids[0]
    slots: torch.Tensor  # int64 [start_pos + len(token_ids)]: physical slots of the whole context
    logits_rows: int = 1  # how many trailing rows need logits (1 for sampling, k+1 for verification)


class KVStorage:
    """The physical K/V pool: one [slots, kv_heads, head_dim] tensor per layer for K and for V."""

    def __init__(self, spec: ModelSpec, num_blocks: int, block_size: int, dtype, device):
        shape = (spec.num_layers, num_blocks * block_size, spec.num_kv_heads, spec.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        # each layer's slice (a view into the pool), for engine.scripted.layers
        self.k_layers, self.v_layers = list(self.k.unbind(0)), list(self.v.unbind(0))
        self.decode_plans: dict = {}  # Model -> the number of its native decode plan on this pool (Model._plan_for)

    def copy_block(self, src: int, dst: int) -> None:
        bs = self.block_size
        self.k[:, dst * bs : (dst + 1) * bs] = self.k[:, src * bs : (src + 1) * bs]
        self.v[:, dst * bs : (dst + 1) * bs] = self.v[:, src * bs : (src + 1) * bs]

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


class Model:
    def __init__(self, spec: ModelSpec, state: dict[str, torch.Tensor], device="cpu", dtype=torch.float32,
                 weights: str = "fp32", q4: dict | None = None, measure: bool = True):
        """state: float32 weights by checkpoint name. weights: the projections' format (engine/kernels.py);
        q4: for weights="q4", {name: (codes, scale, low)} of every projection (engine/quant.py)."""
        self.spec, self.device, self.dtype = spec, torch.device(device), dtype
        self.weights = weights
        D = spec.head_dim
        if weights in ("int8", "q4") and dtype != torch.float32:
            raise ValueError(f"weights={weights!r} runs with float32 activations: leave dtype at torch.float32")

        def w(name):
            return state[name].to(device=self.device, dtype=dtype)

        self.embed = w("model.embed_tokens.weight")
        head = self.embed if spec.tie_word_embeddings or "lm_head.weight" not in state else w("lm_head.weight")
        self.final_norm = w("model.norm.weight")
        names = [f"model.layers.{i}." for i in range(spec.num_layers)]
        proj = {  # the fused matrices: four weight reads per layer instead of seven
            "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "o": ("self_attn.o_proj",), "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}
        built = {}
        for key, parts in proj.items():
            mats = [torch.cat([w(p + part + ".weight") for part in parts]) for p in names]
            biases = [_fused_bias(state, p, parts, w) for p in names]
            codes = None
            if weights == "q4":
                codes = [tuple(torch.cat([q4[p + part + ".weight"][j] for part in parts]) for j in range(3))
                         for p in names]
            built[key] = kernels.build(weights, mats, biases, key, codes, measure)
        # the head has no 4-bit codes (the bundled GGUF stores it as Q8_0, group-wise 8-bit, which no torch CPU
        # kernel runs): under q4 it is int8 per channel
        head_fmt = "int8" if weights == "q4" else weights
        self.head = kernels.build(head_fmt, [head], [None], "head", None, measure)[0]
        self.layers = [dict(in_norm=w(p + "input_layernorm.weight"), post_norm=w(p + "post_attention_layernorm.weight"),
                            **{key: built[key][i] for key in proj}) for i, p in enumerate(names)]
        if spec.qk_norm:  # per head, over head_dim: read with q and k at every step
            for layer, p in zip(self.layers, names):
                layer["q_norm"], layer["k_norm"] = w(p + "self_attn.q_norm.weight"), w(p + "self_attn.k_norm.weight")
        self.windows = list(spec.layer_windows) or [0] * spec.num_layers
        self.scale = 1.0 / math.sqrt(D)
        # the lab's fused small ops (norm, rotary + K/V write, decode attention, silu * up: engine/native.py) on
        # both paths, where they are built
        self.native_ops = self.device.type == "cpu" and dtype == torch.float32 and native.available()
        if self.native_ops:
            self._pack_decode_weights()
        self._script_args = self._scripted_weights()
        self._stack_args = self._native_stack()
        # a sliding window bounds what a layer attends to, not the positions: the context is the model's own
        max_pos = self.max_model_len = spec.max_position
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), rope_inv_freq(spec))
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(device=self.device, dtype=dtype)
        self.sin = emb.sin().to(device=self.device, dtype=dtype)
        self._token_args = self._decode_token_args()

    @classmethod
    def from_loaded(cls, loaded, device="cpu", dtype=torch.float32, weights: str = "fp32") -> "Model":
        """Our model over a LoadedModel's state dict, its projections in `weights` (q4: the GGUF's own codes)."""
        spec = ModelSpec.from_config(loaded.config)
        q4 = None
        if weights == "q4":
            from .quant import NoQ4Weights, read_q4_1

            if loaded.gguf is None:
                raise NoQ4Weights(f"weights='q4' runs the 4-bit weights of a GGUF file, and {loaded.model_id} was "
                                  "not loaded from one; use weights='int8' or 'bf16' for a smaller format")
            # beside the dequantised cache (engine/loader.py), the codes of the same file
            q4 = read_q4_1(loaded.gguf, spec.num_heads, spec.num_kv_heads, loaded.source_dir / "q4_1.safetensors")
        return cls(spec, loaded.state_dict, device=device, dtype=dtype, weights=weights, q4=q4)

    def _pack_decode_weights(self) -> None:
        """The lab's one-row kernels' weights, in the order a decode step reads them (each layer's qkv, o, gate_up,
        down, then the head), moved into one buffer (engine/native.py, pack). A tensor the matrix's other kernels
        share (fp32 and bf16: the same weights for MKL) moves for them too, and so does a tied embedding, so that
        nothing is kept twice."""
        lins = [layer[name] for layer in self.layers for name in ("qkv", "o", "gate_up", "down")] + [self.head]
        own = [lin.single for lin in lins if lin.single.kind in scripted.NATIVE_KINDS]
        if not own:
            return
        moved = {id(k.weight): new for k, new in zip(own, native.pack([k.weight for k in own]))}
        for lin in lins:
            for k in (lin.single, lin.decode, lin.prefill):
                k.weight = moved.get(id(k.weight), k.weight)
        self.embed = moved.get(id(self.embed), self.embed)

    def _scripted_weights(self) -> dict:
        """The layers' tensors as the flat lists engine.scripted.layers takes (built once)."""
        mats = [layer[name] for layer in self.layers for name in ("qkv", "o", "gate_up", "down")]
        kerns = [k for m in mats for k in (m.single, m.decode, m.prefill)]
        spec = self.spec
        return dict(in_norm=[layer["in_norm"] for layer in self.layers],
                    post_norm=[layer["post_norm"] for layer in self.layers],
                    kinds=[k.kind for k in kerns], weights=[k.weight for k in kerns], aux=[k.aux for k in kerns],
                    biases=[m.bias for m in mats],
                    dims=[spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.intermediate_size],
                    eps=spec.rms_norm_eps, scale=self.scale, decode_max_rows=kernels.DECODE_MAX_ROWS,
                    q_norm=[layer["q_norm"] for layer in self.layers if "q_norm" in layer],
                    k_norm=[layer["k_norm"] for layer in self.layers if "k_norm" in layer], windows=self.windows)

    def _native_stack(self) -> dict | None:
        """The layers' one-row kernels as the lab's decode_layers op takes them (engine/native.py: a single
        sequence's decode step through every layer in one native call), where the small ops are the lab's and it
        can call every one-row kernel (all but oneDNN's); else None, and the scripted stack runs."""
        a = self._script_args  # every matrix's one-row kernel is the first of its three entries there
        kinds = a["kinds"][0::3]
        if not self.native_ops or any(k not in scripted.STACK_KINDS for k in kinds):
            return None
        return dict(kinds=kinds, weights=a["weights"][0::3], aux=a["aux"][0::3], biases=a["biases"])

    @property
    def decode_path(self) -> str:
        """How an uninstrumented single-sequence decode step runs the layers (for --stats)."""
        if scripted.LAYERS is None:
            return "the Python loop (TorchScript unavailable)"
        if self._token_args is not None:
            return "one native call from the token to its logits (the lab's decode_token)"
        if self._stack_args is not None:
            return "one native call (the lab's decode_layers)"
        return "the TorchScript stack" + ("" if self.native_ops else " (the lab's kernels are not built)")

    @property
    def attention(self) -> str:
        """What the layers' attention is (for --stats): heads, sliding windows, q/k norms."""
        spec = self.spec
        parts = [f"{spec.num_heads} query heads over {spec.num_kv_heads} K/V heads of {spec.head_dim} dims"]
        local = [i for i, w in enumerate(self.windows) if w]
        if local:
            where = "every layer" if len(local) == spec.num_layers else "layers " + ", ".join(map(str, local))
            parts.append(f"a sliding window of {spec.sliding_window} tokens on {where}")
        if spec.qk_norm:
            parts.append("q and k RMS-normalised per head before RoPE")
        return "; ".join(parts)

    def kernels(self) -> dict:
        """Which kernel runs each projection, for decode and for prefill (the same for every layer)."""
        layer = self.layers[0]
        return {name: layer[name].describe() for name in ("qkv", "o", "gate_up", "down")} | \
            {"head": self.head.describe()}

    # ---- sizes used by metrics -------------------------------------------------------------
    @property
    def element_size(self) -> int:
        return self.final_norm.element_size()

    @functools.cached_property  # every step's event reports it; the weights never change
    def weight_bytes_per_step(self) -> int:
        """Bytes of weights one decode step reads: every layer matrix (in its decode kernel's format), the
        norms and the head once."""
        n = self.head.nbytes + self.final_norm.numel() * self.element_size
        for layer in self.layers:
            n += sum(v.nbytes if isinstance(v, Linear) else v.numel() * v.element_size() for v in layer.values())
        return n

    @functools.cached_property
    def params_per_step(self) -> int:
        """Weights one decode step reads (whatever bytes each takes in its format)."""
        n = self.head.numel + self.final_norm.numel()
        for layer in self.layers:
            n += sum(v.numel if isinstance(v, Linear) else v.numel() for v in layer.values())
        return n

    @functools.cached_property
    def params_per_token(self) -> int:
        """Multiply-accumulates per token in the matmuls (FLOPs = 2 × this), head included."""
        n = self.head.numel
        for layer in self.layers:
            n += sum(v.numel for v in layer.values() if isinstance(v, Linear))
        return n

    # ---- building blocks ----------------------------------------------------------------------
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return scripted.rms_norm(x, weight, self.spec.rms_norm_eps, self.native_ops)

    def logits(self, hidden: torch.Tensor, prefer_decode: bool = False) -> torch.Tensor:
        return self.head(self.rms_norm(hidden, self.final_norm), prefer_decode).float()

    # ---- the forward --------------------------------------------------------------------------
    def forward(self, seqs: list[SeqInput], kv: KVStorage, capture: Capture | None = None,
                capture_seqs: set[int] | None = None, exit_layer: int | None = None, gil_free_hook=None):
        """Run the new tokens of `seqs`; write their K/V into `kv`; return (logits rows, captures).

        logits: float32 [sum(logits_rows), vocab] in sequence order. captures: {seq index: SeqCapture}.
        exit_layer: run only the first `exit_layer` layers, then the final norm and head (the early-exit
        drafter of speculative decoding); only those layers' K/V are written.
        gil_free_hook: called with True before and False after the part that needs no GIL (the scripted layers
        and the head), when the forward takes that path (Engine.forward_hook).
        """
        s = seqs[0] if len(seqs) == 1 else None
        if (s is not None and len(s.token_ids) == 1 and s.logits_rows == 1 and exit_layer is None
                and self._token_args is not None and scripted.LAYERS is not None
                and (capture is None or (capture_seqs is not None and not capture_seqs))):
            # a plain decode step, one native call: outside inference mode, which it needs no more than any op
            # that records nothing for autograd (entering it was ~1 % of a q4 step: Python calls, on the caches
            # the weights' stream has just flushed)
            return self._decode_native(s, kv, gil_free_hook), {}
        return self._forward(seqs, kv, capture, capture_seqs, exit_layer, gil_free_hook)

    @torch.inference_mode()
    def _forward(self, seqs: list[SeqInput], kv: KVStorage, capture: Capture | None, capture_seqs: set[int] | None,
                 exit_layer: int | None, gil_free_hook):
        spec, dev = self.spec, self.device
        H, KV, D = spec.num_heads, spec.num_kv_heads, spec.head_dim
        lens = [len(s.token_ids) for s in seqs]
        decode_only = all(n == 1 for n in lens)
        offsets = [0]
        for n in lens:
            offsets.append(offsets[-1] + n)
        caps: dict[int, SeqCapture] = {}
        want = set(range(len(seqs))) if capture_seqs is None else capture_seqs
        if not want:
            capture = None  # no sequence of this batch is instrumented: the uninstrumented (GIL-free) path
        if capture is None and len(seqs) == 1 and decode_only and scripted.LAYERS is not None:
            return self._decode_one(seqs[0], kv, exit_layer, gil_free_hook), caps

        ids = torch.tensor([t for s in seqs for t in s.token_ids], dtype=torch.long, device=dev)
        positions = torch.cat([torch.arange(s.start_pos, s.start_pos + n) for s, n in zip(seqs, lens)]).to(dev)
        new_slots = torch.cat([s.slots[s.start_pos:] for s in seqs]).to(dev)
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        attn_layers = set(range(spec.num_layers)) if capture is None or capture.attention_layers is None \
            else set(capture.attention_layers)
        if capture is not None:
            caps = {i: SeqCapture() for i in want}
            if capture.attention and capture.max_attention_bytes is not None:
                run = spec.num_layers if exit_layer is None else min(exit_layer, spec.num_layers)
                self._budget_rows(caps, seqs, capture, len(attn_layers & set(range(run))))

        decode_ctx = None
        if decode_only:
            decode_ctx = self._padded_context(seqs)

        x = self.embed[ids]
        # the residual stream after the embedding and after each layer, reduced as it goes (norms of the captured
        # rows, the lens's last positions): keeping every layer's [rows, hidden] for later was 2 x 36 MB a step
        residuals = _Residuals(caps, offsets, capture) if capture is not None and caps and \
            (capture.residual_norms or capture.logit_lens) else None
        if residuals is not None:
            residuals.append(x)
        if capture is not None and capture.embeddings:
            for i, c in caps.items():
                c.embeddings = x[offsets[i]:offsets[i + 1]].float().clone()

        layers = self.layers if exit_layer is None else self.layers[:exit_layer]
        rows = torch.cat([torch.arange(offsets[i + 1] - s.logits_rows, offsets[i + 1])
                          for i, s in enumerate(seqs)]).to(dev)
        if capture is None and scripted.LAYERS is not None:  # nothing to record: the GIL-free stack
            with self._uninstrumented(len(seqs), decode_only and exit_layer is None, gil_free_hook):
                x = self._scripted_layers(x, cos, sin, new_slots, kv, decode_ctx, seqs, offsets, len(layers))
                return self.logits(x[rows]), caps
        for li, layer in enumerate(layers):
            h = self.rms_norm(x, layer["in_norm"])
            qkv = layer["qkv"](h)
            q = scripted.rope_store(qkv, cos, sin, kv.k[li], kv.v[li], new_slots, H, KV, D, self.native_ops,
                                    layer.get("q_norm"), layer.get("k_norm"), spec.rms_norm_eps)
            record = capture is not None and capture.attention and li in attn_layers
            if decode_ctx is not None:
                out, probs = self._attend_decode(q, kv, li, decode_ctx, record)
                if record:
                    for si, c in caps.items():
                        if c.attention_positions == []:  # the row alone exceeds the budget
                            continue
                        row = probs[si].reshape(H, 1, -1)[..., : seqs[si].start_pos + 1]
                        heads = capture.attention_heads
                        c.attention[li] = (row if heads is None else row[heads]).float().clone()
            else:
                outs = []
                for si, s in enumerate(seqs):
                    qs = q[offsets[si]:offsets[si + 1]]
                    probs_out = caps[si] if record and si in caps else None
                    outs.append(self._attend_seq(qs, s, kv, li, probs_out, capture))
                out = torch.cat(outs) if len(outs) > 1 else outs[0]
            x = x + layer["o"](out.reshape(-1, H * D))
            h = self.rms_norm(x, layer["post_norm"])
            gu = layer["gate_up"](h)
            inter = spec.intermediate_size
            x = x + layer["down"](scripted.silu_mul(gu, inter, self.native_ops))
            if residuals is not None:
                residuals.append(x)

        final = x[rows]
        lens_in = self._lens_inputs(caps, residuals, offsets, capture) if capture is not None else {}
        sizes = [t.shape[0] for t in lens_in.values()]
        if (lens_in and self.head.decode_invariant and final.shape[0] <= kernels.DECODE_MAX_ROWS
                and sum(sizes) <= LENS_BLOCK_ROWS):
            # One pass over the LM head (the largest matrix; a decode step is a memory stream) for the real
            # logits and the lens rows together: ~2 ms of a ~48 ms decode step on 2 CPU cores. The real rows
            # take the decode kernel anyway at this count, and it gives a row the same result in any batch of
            # rows (tests/test_engine.py checks the logits bitwise).
            both = self.logits(torch.cat([final] + list(lens_in.values())), prefer_decode=True)
            logits = both[: final.shape[0]]
            lens_top = {i: self._lens_top(rows, capture.lens_top_k)
                        for i, rows in zip(lens_in, both[final.shape[0]:].split(sizes))}
        else:
            logits = self.logits(final)
            # the lens is for display: the faster oneDNN kernel is fine at any row count. In blocks of rows:
            # a prefill's 30 layers x 16 positions of vocab-wide logits and softmax would be ~190 MB at once.
            lens_top = {i: self._lens_top(t, capture.lens_top_k, head=True) for i, t in lens_in.items()}
        if capture is not None:
            self._finish_capture(caps, residuals, seqs, offsets, capture, lens_top)
        return logits, caps

    def _decode_native(self, s: SeqInput, kv: KVStorage, gil_free_hook) -> torch.Tensor:
        """A plain decode step's logits in one native call from the token (decode_token: ~10 fewer torch calls
        than _decode_one, each ~20-60 us on the caches a step's weight stream has just flushed), same ops."""
        plan = kv.decode_plans.get(self)
        if plan is None:
            plan = self._plan_for(kv)
        with self._uninstrumented(1, True, gil_free_hook):
            return torch.ops.inferlab_native.decode_token(plan, s.token_ids[0], s.start_pos, s.slots)

    def _decode_one(self, s: SeqInput, kv: KVStorage, exit_layer: int | None, gil_free_hook) -> torch.Tensor:
        """forward's uninstrumented path for one sequence's one new token where _decode_native does not run (no
        lab library, an early exit, several logits rows): its inputs as views (the token's embedding row, its rotary
        row, its slots) where the general path gathers and concatenates. The same values and ops either way."""
        dev, pos, tok = self.device, s.start_pos, s.token_ids[0]
        x = self.embed[tok : tok + 1]
        cos, sin = self.cos[pos : pos + 1].unsqueeze(1), self.sin[pos : pos + 1].unsqueeze(1)
        decode_ctx = (s.slots[: pos + 1].view(1, -1).to(dev), None, torch.tensor([pos + 1], device=dev))
        num_layers = self.spec.num_layers if exit_layer is None else min(exit_layer, self.spec.num_layers)
        with self._uninstrumented(1, exit_layer is None, gil_free_hook):
            x = self._scripted_layers(x, cos, sin, s.slots[pos : pos + 1].to(dev), kv, decode_ctx, [s], [0, 1],
                                      num_layers)
            return self.logits(x[: s.logits_rows])

    def _plan_for(self, kv: KVStorage):
        """decode_token's plan for this model on `kv`: everything a step passes but the sequence's own inputs,
        handed to the native side once (kept with the pool, which lives no longer than its engine)."""
        plan = torch.ops.inferlab_native.decode_plan(kv.k_layers, kv.v_layers, *self._token_args)
        kv.decode_plans[self] = plan
        weakref.finalize(kv, torch.ops.inferlab_native.drop_plan, plan)  # with the pool, its plans go
        return plan

    def _decode_token_args(self) -> tuple | None:
        """decode_plan's arguments after the K/V pools (what a plain decode step passes unchanged every time), where
        the layers run as one native call and the head's one-row kernel is one of the lab's; else None."""
        head = self.head.single
        if self._stack_args is None or head.kind not in scripted.NATIVE_KINDS:
            return None
        a, stack = self._script_args, self._stack_args
        return (self.embed, self.cos, self.sin, a["in_norm"], a["post_norm"], stack["kinds"], stack["weights"],
                stack["aux"], stack["biases"], a["dims"], a["eps"], a["scale"], self.final_norm, head.kind,
                head.weight, head.aux, self.head.bias, a["q_norm"], a["k_norm"], a["windows"])

    @contextlib.contextmanager
    def _uninstrumented(self, batch: int, decode: bool, gil_free_hook):
        """Around the GIL-free stack and the head: the hook (True before, False after), and for plain decode steps
        on the compute thread the governor's timing and thread count (engine/governor.py)."""
        governed = decode and compute.on_compute_thread()
        if governed:
            GOVERNOR.before(self, batch)
            started = time.perf_counter()
        if gil_free_hook is not None:
            gil_free_hook(True)
        try:
            yield
            if governed:
                GOVERNOR.after(self, batch, time.perf_counter() - started)
        finally:
            if governed:
                GOVERNOR.restore()
            if gil_free_hook is not None:
                gil_free_hook(False)

    def _scripted_layers(self, x, cos, sin, new_slots, kv: KVStorage, decode_ctx, seqs: list[SeqInput],
                         offsets: list[int], num_layers: int) -> torch.Tensor:
        a = self._script_args
        slots, mask, lengths = decode_ctx if decode_ctx is not None else (None, None, None)
        stack = self._stack_args
        if stack is not None and decode_ctx is not None and x.size(0) == 1:  # one sequence, one token
            n = 4 * num_layers
            return torch.ops.inferlab.decode_layers(
                x, cos, sin, new_slots, kv.k_layers[:num_layers], kv.v_layers[:num_layers], a["in_norm"][:num_layers],
                a["post_norm"][:num_layers], stack["kinds"][:n], stack["weights"][:n], stack["aux"][:n],
                stack["biases"][:n], a["dims"], a["eps"], a["scale"], slots, lengths, a["q_norm"][:num_layers],
                a["k_norm"][:num_layers], a["windows"][:num_layers])
        return scripted.LAYERS(
            x, cos, sin, new_slots, kv.k_layers[:num_layers], kv.v_layers[:num_layers],
            a["in_norm"][:num_layers], a["post_norm"][:num_layers], a["kinds"][: 12 * num_layers],
            a["weights"][: 12 * num_layers], a["aux"][: 12 * num_layers], a["biases"][: 4 * num_layers], a["dims"],
            a["eps"], a["scale"], a["decode_max_rows"], slots, mask, lengths, offsets, [s.start_pos for s in seqs],
            [] if decode_ctx is not None else [s.slots.to(self.device) for s in seqs], self.native_ops,
            a["q_norm"][:num_layers], a["k_norm"][:num_layers], a["windows"][:num_layers])

    def _lens_top(self, rows: torch.Tensor, k: int, head: bool = False):
        """(ids, probs) of the top-k of softmax(logits) for each row, LENS_BLOCK_ROWS rows at a time; `rows`
        are logits, or with head=True final hidden states that go through the final norm and head first."""
        ids, probs = [], []
        for block in rows.split(LENS_BLOCK_ROWS):
            top = torch.softmax(self.logits(block, prefer_decode=True) if head else block, dim=-1).topk(k, dim=-1)
            ids.append(top.indices)
            probs.append(top.values)
        return (torch.cat(ids), torch.cat(probs)) if len(ids) > 1 else (ids[0], probs[0])

    def _padded_context(self, seqs: list[SeqInput]):
        """Slots of every sequence padded to the longest context, the mask hiding the padding, and the context
        lengths (what the lab's attention op reads instead of the mask)."""
        ctx = [s.start_pos + 1 for s in seqs]
        tmax = max(ctx)
        lengths = torch.tensor(ctx, dtype=torch.long, device=self.device)
        if len(seqs) == 1:
            return seqs[0].slots[: ctx[0]].view(1, -1).to(self.device), None, lengths
        slots = torch.zeros(len(seqs), tmax, dtype=torch.long)
        mask = torch.zeros(len(seqs), 1, 1, tmax, dtype=torch.bool)
        for i, s in enumerate(seqs):
            slots[i, : ctx[i]] = s.slots[: ctx[i]]
            mask[i, ..., : ctx[i]] = True
        return slots.to(self.device), mask.to(self.device), lengths

    def _attend_decode(self, q, kv: KVStorage, li: int, decode_ctx, want_probs: bool = True):
        """One query per sequence: grouped-query attention as two small matmuls, no K/V head copies. With the
        lab's ops the output is theirs, as on the scripted path (the same bits), and the probabilities shown
        are torch's, computed only when wanted."""
        slots, mask, lengths = decode_ctx
        window = self.windows[li]
        if self.native_ops:
            out = scripted.attend_decode(q, kv.k[li], kv.v[li], slots, mask, lengths, self.spec.num_kv_heads,
                                         self.spec.head_dim, self.scale, True, window)
            if not want_probs:
                return out, None
            return out, self._attend_decode_torch(q, kv, li, slots, scripted.decode_visible(slots, mask, lengths,
                                                                                             window))[1]
        return self._attend_decode_torch(q, kv, li, slots, scripted.decode_visible(slots, mask, lengths, window))

    def _attend_decode_torch(self, q, kv: KVStorage, li: int, slots, mask):
        B, T = slots.shape
        KV, D = self.spec.num_kv_heads, self.spec.head_dim
        k = kv.k[li].index_select(0, slots.view(-1)).view(B, T, KV, D)  # index_select: 4x faster than [slots]
        v = kv.v[li].index_select(0, slots.view(-1)).view(B, T, KV, D)
        qg = q.view(B, KV, -1, D)  # the query heads that share one K/V head sit together
        scores = torch.matmul(qg, k.permute(0, 2, 3, 1)) * self.scale  # [B, KV, group, T]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, v.transpose(1, 2)).view(B, -1, D), probs  # [B, H, D], [B, KV, group, T]

    def _attend_seq(self, q, s: SeqInput, kv: KVStorage, li: int, cap: SeqCapture | None, capture):
        """Causal attention of one sequence's new queries over its whole context, read via its slots."""
        n, ctx = q.shape[0], s.start_pos + q.shape[0]
        slots = s.slots[:ctx].to(self.device)
        k = kv.k[li].index_select(0, slots).transpose(0, 1)  # [KV, ctx, D]
        v = kv.v[li].index_select(0, slots).transpose(0, 1)
        qh = q.transpose(0, 1)  # [H, n, D]
        # query i sits at position start_pos + i and may see keys 0..start_pos + i (the last `window` of them)
        mask = scripted.causal_mask(s.start_pos, n, self.windows[li], self.device)
        if cap is None:
            out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, enable_gqa=True)
            return out.transpose(0, 1)
        group = self.spec.num_heads // self.spec.num_kv_heads
        kf, vf = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        heads = capture.attention_heads
        keep = n if cap.attention_positions is None else len(cap.attention_positions)
        if keep < n:
            return self._attend_blocks(qh, kf, vf, mask, keep, cap, li, heads)
        probs = self._probs(qh, kf, mask)
        kept = probs if heads is None else probs[heads]
        cap.attention[li] = kept.float().clone()
        return (probs @ vf).transpose(0, 1)

    def _probs(self, qh, kf, mask):
        scores = (qh @ kf.transpose(1, 2)) * self.scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(qh.dtype)

    def _attend_blocks(self, qh, kf, vf, mask, keep: int, cap: SeqCapture, li: int, heads):
        """The capture path of _attend_seq over blocks of query rows, keeping the probabilities of the last
        `keep` rows only: the forward never holds heads x n x ctx scores (ATTENTION_BLOCK_BYTES per block).
        Every row goes through the same eager ops as the unbudgeted path, in blocks of >= MIN_BLOCK_ROWS rows,
        so outputs and kept rows equal the unbudgeted capture's bitwise (tests/test_hostile_capture.py)."""
        H, n, ctx = qh.shape[0], qh.shape[1], kf.shape[1]
        rows = max(MIN_BLOCK_ROWS, ATTENTION_BLOCK_BYTES // max(1, H * ctx * qh.element_size()))
        bounds = list(range(0, n, rows)) + [n]
        if len(bounds) > 2 and bounds[-1] - bounds[-2] < MIN_BLOCK_ROWS:
            del bounds[-2]  # a short last block joins the one before it
        outs, kept = [], []
        for a, b in zip(bounds[:-1], bounds[1:]):
            probs = self._probs(qh[:, a:b], kf, mask[a:b] if mask is not None else None)
            outs.append(probs @ vf)
            if b > n - keep:
                sel = probs[:, max(a, n - keep) - a:]
                kept.append((sel if heads is None else sel[heads]).float().clone())
            del probs
        if kept:
            cap.attention[li] = torch.cat(kept, dim=1) if len(kept) > 1 else kept[0]
        return torch.cat(outs, dim=1).transpose(0, 1)

    def _budget_rows(self, caps: dict[int, SeqCapture], seqs: list[SeqInput], capture: Capture,
                     layers: int) -> None:
        """Which query rows of each captured sequence fit capture.max_attention_bytes (the last ones)."""
        heads = self.spec.num_heads if capture.attention_heads is None else len(capture.attention_heads)
        for si, c in caps.items():
            s = seqs[si]
            n = len(s.token_ids)
            ctx = s.start_pos + n
            row_bytes = layers * heads * ctx * 4  # every recorded layer and head, kept as float32
            keep = n if row_bytes == 0 else min(n, max(0, capture.max_attention_bytes) // row_bytes)
            c.attention_positions = list(range(ctx - keep, ctx))

    def _lens_inputs(self, caps, residuals, offsets, capture: Capture) -> dict[int, torch.Tensor]:
        """{seq index: the residual stream after each layer at its last positions, [layers * keep, hidden]}."""
        if not caps or residuals is None or not capture.logit_lens:
            return {}
        out = {}
        for i in caps:
            # after each layer; the last layer's lens equals the real logits
            tail = torch.stack([t[i] for t in residuals.tails[1:]])
            out[i] = tail.reshape(-1, tail.shape[-1])
        return out

    def _finish_capture(self, caps, residuals, seqs, offsets, capture: Capture, lens_top) -> None:
        if not caps or residuals is None:
            return
        for i, c in caps.items():
            if capture.residual_norms:
                c.residual_norms = torch.stack([norms[i] for norms in residuals.norms])  # [L+1, rows]
            if i in lens_top:
                n = offsets[i + 1] - offsets[i]
                keep = min(n, capture.lens_max_positions)
                L = len(residuals.tails) - 1
                ids, probs = lens_top[i]
                c.lens_ids = ids.view(L, keep, -1)
                c.lens_probs = probs.view(L, keep, -1)
                start = seqs[i].start_pos
                c.lens_positions = list(range(start + n - keep, start + n))


class _Residuals:
    """What the capture needs of the residual stream after the embedding and after each layer, per captured
    sequence: the norm of every row, and a copy of the last lens_max_positions rows for the logit lens."""

    def __init__(self, caps: dict[int, SeqCapture], offsets: list[int], capture: Capture):
        self.caps, self.offsets, self.capture = caps, offsets, capture
        self.norms: list[dict[int, torch.Tensor]] = []
        self.tails: list[dict[int, torch.Tensor]] = []

    def append(self, x: torch.Tensor) -> None:
        o, cap = self.offsets, self.capture
        if cap.residual_norms:
            self.norms.append({i: x[o[i]:o[i + 1]].float().norm(dim=-1) for i in self.caps})
        if cap.logit_lens:
            keep = {i: min(o[i + 1] - o[i], cap.lens_max_positions) for i in self.caps}
            # a copy: a view would keep the whole [rows, hidden] of every layer alive
            self.tails.append({i: x[o[i + 1] - keep[i]:o[i + 1]].clone() for i in self.caps})
