"""`tidepool serve`: start tritonserver, say where it listens, restart it when a model's Python stub
dies (Triton 2.51 does not), and stop it inside the grace period on SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from tidepool.launcher.server import Cancelled, ServerConfig, TritonServer
from tidepool.machine import describe_cpu, planned_on

POLL_S = 0.2  # how soon a stop request is noticed
STUB_CHECK_S = 1.0  # how often the stubs are counted
RESTART_GRACE_S = 10.0  # a server whose stub died drains for this long before its restart


class StopFlag:
    """Set from a signal handler. A handler runs between two bytecodes of the main thread, maybe
    inside a lock that thread holds, so it only assigns an attribute: no locks, no I/O."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signum

    def is_set(self) -> bool:
        return self.signal is not None


def _say(text: str) -> None:
    try:
        print(text, flush=True)
    except (BrokenPipeError, ValueError):  # whoever read our output is gone (make was killed)
        pass


def serve(config: ServerConfig, say: Callable[[str], None] = _say) -> int:
    stop = StopFlag()
    previous = {sig: signal.signal(sig, stop.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = TritonServer(config, echo=lambda line: print(line, file=sys.stderr, flush=True))
    try:
        say(f"tidepool: starting tritonserver for {config.model_repository} ...")
        try:
            server.start(cancelled=stop.is_set)
        except Cancelled:
            say("tidepool: stopped before the server was ready")
            return 0
        for warning in planned_elsewhere(config.model_repository):
            say(warning)
        say(
            f"tidepool: serving {', '.join(server.models)}\n"
            f"  HTTP    http://{config.http_url}\n"
            f"  gRPC    {config.grpc_url}\n"
            f"  metrics {config.metrics_url}\n"
            "Press Ctrl-C to stop."
        )
        code = _supervise(server, stop, say)
        if code is not None:
            return code
        say(f"tidepool: stopping tritonserver (draining for up to {config.grace_s:.0f} s) ...")
        began = time.monotonic()
        exit_code = server.stop()
        say(f"tidepool: stopped in {time.monotonic() - began:.1f} s (tritonserver exit code {exit_code})")
        return 0
    finally:
        server.stop()  # no-op after a clean stop; kills the server if anything above failed
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def planned_elsewhere(repository: Path) -> list[str]:
    """A line for each model whose config was planned on a CPU other than this one: its batcher
    settings were measured there, and light traffic in particular suffers when they do not fit."""
    here = describe_cpu()
    warnings = []
    for config in sorted(repository.glob("*/config.pbtxt")):
        machines = [planned_on(line) for line in config.read_text().splitlines() if line.startswith("#")]
        there = next((m.removeprefix("cpu: ") for m in machines if m and m.startswith("cpu: ")), None)
        if there is not None and there != here:
            warnings.append(
                f"tidepool: NOTE: {config.parent.name}'s config was planned on {there}; "
                f"this machine has {here}. Re-plan it here: tidepool plan {config.parent} "
                "--memory-budget ... --latency-budget-ms ... --write (for the examples: make configs)"
            )
    return warnings


def _supervise(server: TritonServer, stop: StopFlag, say: Callable[[str], None]) -> int | None:
    """Run until a stop is asked for (None) or the server exits on its own (its exit code)."""
    assert server.process is not None
    next_check = time.monotonic() + STUB_CHECK_S
    while not stop.is_set():
        if server.process.poll() is not None:
            say(f"tidepool: tritonserver exited on its own with code {server.process.returncode}")
            return server.process.returncode or 1
        time.sleep(POLL_S)
        if time.monotonic() < next_check or stop.is_set():
            continue
        next_check = time.monotonic() + STUB_CHECK_S
        dead = server.dead_stubs()
        if dead:
            # The only way back for those instances on this Triton: a fresh server, same ports.
            say(f"tidepool: the Python stub of {', '.join(dead)} died; restarting tritonserver")
            server.stop(grace_s=RESTART_GRACE_S)
            try:
                server.start(cancelled=stop.is_set)
            except Cancelled:
                return None
            say(f"tidepool: restarted; serving {', '.join(server.models)}")
    return None
