"""What runs inside the Python stub that Triton starts for each model instance: the backend's
TritonPythonModel (model.py) over a ModelInstance free of Triton. Imports only tidepool.pool,
tidepool.spec and tidepool.errors of the rest of the package (tests/unit/test_layout.py checks)."""
