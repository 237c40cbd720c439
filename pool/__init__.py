"""Tidepool's memory pool: upstream resources, block strategies and the pool; knows nothing of Triton."""
