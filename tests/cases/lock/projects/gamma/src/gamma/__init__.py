"""gamma: a tiny test distribution."""
