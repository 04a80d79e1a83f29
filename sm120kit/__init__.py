"""sm120kit: make SGLang run correctly and fast on NVIDIA SM120 GPUs (compute capability 12.x)."""

__version__ = "0.1.0"
