"""Source builds: requests, realizing, builders, toolchain, patches, the device-code audit."""
