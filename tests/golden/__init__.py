"""Golden digests of the default backward on the host (see corpus.py)."""
