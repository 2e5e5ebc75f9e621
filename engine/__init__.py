"""InferLab's inference engine: a real model, stepped one scheduler step at a time.

    from engine import Engine, SamplingParams
    eng = Engine.from_pretrained("bundled", device="cpu")
    res = eng.generate("Что такое гравитация?", SamplingParams(max_tokens=64, temperature=0.0), chat=True)
"""
from .engine import Engine, GenerationResult
from .events import CaptureData, SeqEvent, StepEvent
from .loader import ModelLoadError
from .model import Capture
from .sampling import SamplingParams, sampling_probs
from .speculative import SpeculativeConfig

__all__ = ["Engine", "GenerationResult", "SamplingParams", "sampling_probs", "SpeculativeConfig", "StepEvent",
           "SeqEvent", "CaptureData", "Capture", "ModelLoadError"]
