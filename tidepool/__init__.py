"""Tidepool: a Triton Inference Server backend that serves PyTorch models through a memory pool.

Importing this package imports nothing else: the Python stub that Triton starts for each model
instance imports only `tidepool.runtime`, `tidepool.pool`, `tidepool.spec` and `tidepool.errors`."""

__version__ = "0.2.0"
