"""qval: the release gate for quantized LLM deployments."""

__version__ = "0.1.0"
