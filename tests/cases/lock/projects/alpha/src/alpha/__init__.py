"""alpha: a tiny test distribution."""
