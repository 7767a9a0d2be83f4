"""Source builds: requests, realising, builders, toolchain, patches, the device-code audit."""
