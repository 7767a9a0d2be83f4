"""Helpers shared by tests: real services (Docker engine, registry), fixture builders."""
