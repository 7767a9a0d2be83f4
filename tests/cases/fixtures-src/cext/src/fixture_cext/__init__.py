from fixture_cext._hello import add, greeting

__all__ = ["add", "greeting"]
