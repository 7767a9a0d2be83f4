from fixture_cuda._kernel import gencode

__all__ = ["gencode"]
