"""Runs on the host: finds tritonserver and its Python backend, lays out a backend directory, starts
the server bound to its launcher's life, supervises it and stops it inside a grace period."""
