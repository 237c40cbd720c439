"""The file Triton loads for a model whose config says backend: "tidepool"
(<backend-directory>/tidepool/model.py). `tidepool install-backend DIR` and `tidepool serve` write
this same file there; what it serves comes from the `tidepool` package of the environment whose
`bin/` is first on tritonserver's PATH."""

from tidepool.runtime.model import TritonPythonModel

__all__ = ["TritonPythonModel"]
