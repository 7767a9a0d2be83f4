"""torch: a tiny test distribution."""
