"""vllm: a tiny test distribution."""
