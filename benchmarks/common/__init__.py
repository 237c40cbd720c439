"""Helpers the benchmark scripts share: measuring served models in turn, the plain Python backend."""
