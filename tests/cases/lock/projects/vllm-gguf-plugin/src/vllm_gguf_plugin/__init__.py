"""vllm-gguf-plugin: a tiny test distribution."""
