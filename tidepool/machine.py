"""What machine this is: the cores this process may use, and one line that profiles and generated
configs record (cores and CPU model, or the GPU's name), so a config planned elsewhere can be
recognised as such."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which container cpusets restrict)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def describe_cpu(cores: int | None = None) -> str:
    return f"{cores or usable_cores()} cores, {cpu_model()}"


# The line of a config's comment header that says where it was planned.
PLANNED_ON = "Planned on: "


def planned_on_line(machine: str) -> str:
    return f"{PLANNED_ON}{machine}."


def planned_on(header_line: str) -> str | None:
    """The machine a config's header line names (as describe_machine wrote it), or None."""
    text = header_line.removeprefix("#").strip()
    return text.removeprefix(PLANNED_ON).rstrip(".") if text.startswith(PLANNED_ON) else None


def describe_machine(device: str, gpu_name: str | None = None) -> str:
    """'cpu: 2 cores, <model>' or 'cuda: <GPU name>'."""
    if device.startswith("cuda"):
        return f"cuda: {gpu_name or 'unknown GPU'}"
    return f"cpu: {describe_cpu()}"
