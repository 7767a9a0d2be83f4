DEFAULT_KV_CACHE = "auto"


def kv_cache_dtype(capability):
    if capability >= 100 and capability < 110:
        return "fp8_e4m3"
    return DEFAULT_KV_CACHE
