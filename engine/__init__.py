"""InferLab's inference engine: a real model, stepped one scheduler step at a time.

    from engine import Engine, SamplingParams
    eng = Engine.from_pretrained("bundled", device="cpu")
    res = eng.generate("Что такое гравитация?", SamplingParams(max_tokens=64, temperature=0.0), chat=True)

Bad arguments raise ValueError or ArgumentTypeError (a TypeError that is also a ValueError) naming the argument;
a step that fails raises StepFailed after undoing itself.
"""
from .openmp_env import SETTING as OPENMP_SETTING  # first: before anything imports torch (see the module)
from .checks import ArgumentTypeError, StepFailed
from .engine import Engine, GenerationResult
from .events import CaptureData, SeqEvent, StepEvent
from .grammar import Grammar
from .loader import ModelLoadError
from .model import Capture
from .sampling import GREEDY_TEMPERATURE, MAX_STOP_CHARS, MAX_STOP_STRINGS, SamplingParams, sampling_probs
from .speculative import SpeculativeConfig
from .tokenizer import MAX_BPE_CHARS, MAX_PROMPT_CHARS, MAX_SYSTEM_CHARS

__all__ = ["Engine", "GenerationResult", "SamplingParams", "Grammar", "sampling_probs", "SpeculativeConfig", "StepEvent",
           "SeqEvent", "CaptureData", "Capture", "ModelLoadError", "StepFailed", "ArgumentTypeError",
           "GREEDY_TEMPERATURE", "MAX_STOP_STRINGS", "MAX_STOP_CHARS", "MAX_PROMPT_CHARS", "MAX_SYSTEM_CHARS",
           "MAX_BPE_CHARS"]
