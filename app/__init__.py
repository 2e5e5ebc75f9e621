"""InferLab's browser lab: a Gradio page that steps the engine and draws every stage from its StepEvents."""
