"""Golden digests of the host executor (see corpus.py)."""
