"""The package's folders are its architecture: what each part may import, checked on the source and
on what a process really loads."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import tidepool
from tidepool.testing import MODEL_REPOSITORY, REPO_ROOT

PACKAGE = Path(tidepool.__file__).parent
PROFILES = Path(__file__).parent / "profiles"

# The parts of tidepool each part may import (its own included). Dependencies point one way:
# the stub's closure (pool, spec, runtime) imports nothing of the offline tools or the launcher.
ALLOWED = {
    "errors": set(),
    # pool: its node ledger reads the machine's memory (machine), sizes as typed (spec) and whose
    # processes still run (processes).
    "pool": {"errors", "spec", "machine", "processes"},
    "spec": {"errors"},
    # parameters: the table of backend parameters, which the runtime reads and the planner writes.
    "parameters": {"errors", "spec"},
    # inputs: valid random inputs from a config (numpy only), to check a frozen graph at load.
    "runtime": {"errors", "spec", "parameters", "inputs", "sequences", "pool", "processes", "machine"},
    "configfile": {"errors"},
    "inputs": {"errors", "spec"},
    # sequences: a model's sequence inputs, their lengths and the length mix traffic has.
    "sequences": {"errors", "spec", "parameters", "inputs"},
    "machine": set(),
    "ports": {"errors"},
    "processes": set(),
    "planning": {
        "errors",
        "spec",
        "parameters",
        "configfile",
        "inputs",
        "sequences",
        "machine",
        "pool",
        "runtime",
        "launcher",
        "clients",
        "extras",
    },
    "launcher": {"errors", "ports", "machine", "configfile", "spec", "processes"},
    "clients": {"errors", "spec", "inputs", "sequences", "ports", "configfile", "extras"},
    "testing": {
        "configfile",
        "clients",
        "inputs",
        "spec",
        "sequences",
        "launcher",
    },  # bad_requests starts a server
    # deploy: manifests from planned configs (reads them, never plans), and the scaling signal.
    "deploy": {"errors", "spec", "parameters", "configfile", "clients"},
    # extras: optional packages asked for by name, with how to install them.
    "extras": {"errors"},
    "cli": None,  # the command line may use every part
    "commands": None,
}


def part_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py") if relative.parts else ""


def imported_parts(path: Path) -> set[str]:
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        parts |= {name.split(".")[1] for name in names if name.startswith("tidepool.")}
    return parts


def test_every_module_imports_only_the_parts_its_part_may_use():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = part_of(path)
        if part in ("__init__", ""):
            continue
        assert part in ALLOWED, f"{path}: a new part of the package; say what it may import in ALLOWED"
        allowed = ALLOWED[part]
        if allowed is not None:
            wrong += [
                f"{path.relative_to(PACKAGE)} imports tidepool.{p}"
                for p in imported_parts(path) - allowed - {part}
            ]
    assert not wrong, "\n".join(wrong)


def loaded_modules(code: str) -> dict[str, list[str]]:
    """Run `code` in a fresh interpreter; return the tidepool modules and the top-level packages it loaded."""
    report = "import sys, json; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{report}"], capture_output=True, text=True, check=True, timeout=300
    )
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "tidepool": [m for m in modules if m.startswith("tidepool")],
        "top": sorted({m.split(".")[0] for m in modules}),
    }


def test_the_python_stub_imports_only_runtime_pool_and_the_small_modules_they_share():
    # What the stub runs: backend/model.py as `model`, with Triton's pb_utils importable.
    loaded = loaded_modules(
        "import sys, types, runpy\n"
        "sys.modules['triton_python_backend_utils'] = types.ModuleType('triton_python_backend_utils')\n"
        f"assert 'TritonPythonModel' in runpy.run_path({str(REPO_ROOT / 'backend' / 'model.py')!r})"
    )
    allowed_prefixes = ("tidepool.runtime", "tidepool.pool")
    allowed = {"tidepool", "tidepool.errors", "tidepool.spec", "tidepool.inputs", "tidepool.processes",
               "tidepool.machine", "tidepool.parameters", "tidepool.sequences"}  # fmt: skip
    extra = [m for m in loaded["tidepool"] if m not in allowed and not m.startswith(allowed_prefixes)]
    assert not extra, f"the stub's import closure grew: {extra}"
    offline = {"tritonclient", "google", "grpc", "matplotlib", "locust", "gevent", "psutil"} & set(
        loaded["top"]
    )
    assert not offline, f"the stub loads what only offline tools need: {sorted(offline)}"


def test_planning_from_a_saved_profile_never_imports_torch(tmp_path):
    model_dir = tmp_path / "encoder"
    model_dir.mkdir()
    (model_dir / "config.pbtxt").write_text((MODEL_REPOSITORY / "encoder" / "config.pbtxt").read_text())
    argv = ["plan", str(model_dir), "--profile", str(PROFILES / "encoder_cpu.json"),
            "--memory-budget", "1GiB", "--latency-budget-ms", "100", "--write"]  # fmt: skip
    loaded = loaded_modules(f"from tidepool.cli import main\nassert main({argv!r}) == 0")
    assert "torch" not in loaded["top"]
    assert "# Generated by `tidepool plan`" in (model_dir / "config.pbtxt").read_text()
