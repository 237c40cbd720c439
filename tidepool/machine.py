"""What machine this is: the cores this process may use, and one line that profiles and generated
configs record (cores and CPU model, or the GPU's name), so a config planned elsewhere can be
recognised as such."""

from __future__ import annotations

import math
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


# Where a container's CPU quota is: cgroup v2 ("200000 100000": 2 cores' time per period, or "max"),
# then cgroup v1's pair of files.
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """The cores' worth of time per period this process's cgroup may use (Kubernetes' CPU limit),
    or None where there is no quota."""
    try:
        quota, _, period = (root / "cpu.max").read_text().partition(" ")
        if quota.strip() != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (which cpusets restrict), and no more
    than its cgroup's CPU quota rounded up. A Kubernetes pod with a CPU limit of 2 on a 64-core node
    sees all 64 in its affinity; threads sized to those would share 2 cores' time 64 ways."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return cores if limit is None else max(1, min(cores, math.ceil(limit - 1e-9)))


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
