"""The content-addressed store: blobs (``blobs``), their stat stamps (``stamps``), derivation and
root records (``core``), garbage collection (``gc``), a full check (``verify``) and a remote cache
in an OCI registry (``remote``)."""
