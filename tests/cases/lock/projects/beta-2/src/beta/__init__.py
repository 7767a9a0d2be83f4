"""beta: a tiny test distribution."""
