"""OCI image layouts read from disk: the media types, the descriptor, the one layout reader
(:mod:`envbuild.oci.layout`) and the one blob reader (:mod:`envbuild.oci.blobs`), through which
everything that reads a layer of a layout reads it."""
