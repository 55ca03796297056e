"""zgtool: measure what the gateway layer in front of an LLM costs."""

__version__ = "0.1.0"
