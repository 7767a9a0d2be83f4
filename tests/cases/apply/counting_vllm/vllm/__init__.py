"""A stand-in for vLLM's parser entry points that counts how often it is imported (tests of
the verdict cache in tests/apply/test_serving_checks.py; the real parser is tested there too)."""

import os

if os.environ.get("COUNTING_VLLM_LOG"):
    with open(os.environ["COUNTING_VLLM_LOG"], "a") as f:
        f.write("imported\n")
