"""vllm-specdec-exporter: speculative-decoding acceptance for vLLM, from /metrics."""

__version__ = "0.1.0"
