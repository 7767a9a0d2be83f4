/* A tiny compiled library (loaded with ctypes, so no Python headers are needed): the "source
   build" the remote-cache tests build once and share. */
long fastsum_add(long a, long b) { return a + b; }
