"""The optional parts of an install: `tidepool[tools]` adds the bundled tritonserver
(nvidia-pytriton), Locust and matplotlib, which a machine with NVIDIA's container serving does not
need. What needs one of them asks for it here and says how to install it when it is missing."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from tidepool.errors import TidepoolError

TOOLS_EXTRA = "pip install 'tidepool[tools]'"


class MissingExtra(TidepoolError):
    """A command needs a package of the tools extra that this install lacks."""


def require(module: str, purpose: str) -> None:
    """MissingExtra unless `module` can be imported."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(f"{purpose} needs {module}, which is not installed: {TOOLS_EXTRA}")


def pyplot() -> ModuleType:
    """matplotlib.pyplot, drawing to files (no screen needed)."""
    require("matplotlib", "writing plots")
    import matplotlib

    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")
