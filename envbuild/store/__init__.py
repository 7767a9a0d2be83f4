"""The content-addressed store: blobs, derivations, gc, verify, the remote cache."""
