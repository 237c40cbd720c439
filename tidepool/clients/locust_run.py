"""`tidepool load`: a headless Locust run of the Triton users (alone, or one master and N workers on
this machine), its CSV and HTML reports in one folder, and a verdict: non-zero when any request
failed or p99 is over the bound."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidepool.clients.connection import DEFAULT_URLS
from tidepool.errors import TidepoolError
from tidepool.extras import require
from tidepool.ports import free_port

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
USER_CLASSES = {"grpc": "TritonGrpcUser", "http": "TritonHttpUser"}


@dataclass
class LoadSettings:
    model: str
    users: int = 32
    spawn_rate: float = 8.0
    duration: str = "60s"
    protocol: str = "grpc"
    url: str | None = None
    p99_ms: float | None = None
    workers: int = 0
    report_dir: Path | None = None
    batch: int = 1
    input_data: str | None = None
    step_users: str | None = None  # "8": +8 users each step; "1,2,4,8": the users at each step
    step_seconds: float = 10.0
    request_log: bool = False  # every request in report_dir/requests-<pid>.csv (see RequestLog)
    lengths: str | None = None  # a length mix for a model with sequence inputs (default: its LENGTH_MIX)


@dataclass
class LoadSummary:
    requests: int
    failures: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    report_dir: Path
    by_worker: dict[str, int]
    # A model with sequence inputs (locustfile.named): 0 and NaN otherwise.
    tokens_per_s: float = 0.0
    p99_short_ms: float = float("nan")
    p99_long_ms: float = float("nan")

    def verdict(self, p99_bound_ms: float | None) -> list[str]:
        problems = []
        if self.requests == 0:
            problems.append("no request was answered")
        if self.failures:
            problems.append(f"{self.failures} of {self.requests + self.failures} requests failed")
        if p99_bound_ms is not None and self.p99_ms > p99_bound_ms:
            problems.append(f"p99 {self.p99_ms:.0f} ms is over the bound of {p99_bound_ms:.0f} ms")
        return problems


class LoadError(TidepoolError):
    """Locust could not run or wrote no figures."""


def _locust_argv(settings: LoadSettings, role: list[str]) -> list[str]:
    """The locust command line of one process; `role` adds what makes it a master or a worker."""
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--loglevel", "WARNING", *role,
            USER_CLASSES[settings.protocol]]  # fmt: skip


def _runner_role(settings: LoadSettings, prefix: Path) -> list[str]:
    """What the process that runs the test (alone or as the master) is told: where, how much, reports."""
    url = settings.url or DEFAULT_URLS[settings.protocol]
    return ["--host", url, "--headless", "--only-summary", "-u", str(settings.users),
            "-r", str(settings.spawn_rate), "-t", settings.duration, "--csv", str(prefix),
            "--html", str(prefix.parent / "report.html"), "--stop-timeout", "5"]  # fmt: skip


def run_load(settings: LoadSettings) -> LoadSummary:
    require("locust", "tidepool load")
    if settings.protocol not in USER_CLASSES:
        raise LoadError(f"protocol must be grpc or http, got {settings.protocol!r}")
    report_dir = settings.report_dir or Path("reports") / dt.datetime.now().strftime("load-%Y%m%d-%H%M%S")
    report_dir.mkdir(parents=True, exist_ok=True)
    prefix = report_dir / "locust"
    env = dict(os.environ, TIDEPOOL_MODEL=settings.model, TIDEPOOL_BATCH=str(settings.batch))
    env["TIDEPOOL_WORKER_REPORT"] = str(report_dir / "workers.json")
    if settings.request_log:
        env["TIDEPOOL_REQUEST_LOG"] = str(report_dir.resolve())
    if settings.input_data:
        env["TIDEPOOL_INPUT_DATA"] = str(Path(settings.input_data).resolve())
    if settings.lengths:
        env["TIDEPOOL_LENGTHS"] = settings.lengths
    if settings.step_users:
        env.update(
            TIDEPOOL_STEP_USERS=str(settings.step_users), TIDEPOOL_STEP_SECONDS=str(settings.step_seconds)
        )

    runner = _runner_role(settings, prefix)
    if settings.workers <= 0:
        done = subprocess.run(_locust_argv(settings, runner), env=env, stdin=subprocess.DEVNULL)
        returncode = done.returncode
    else:
        port = str(free_port())
        master_role = ["--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", port,
                       "--expect-workers", str(settings.workers),
                       "--expect-workers-max-wait", "60"]  # fmt: skip
        worker_role = ["--worker", "--master-host", "127.0.0.1", "--master-port", port]
        master = subprocess.Popen(
            _locust_argv(settings, runner + master_role), env=env, stdin=subprocess.DEVNULL
        )
        workers = [
            subprocess.Popen(_locust_argv(settings, worker_role), env=env, stdin=subprocess.DEVNULL)
            for _ in range(settings.workers)
        ]
        returncode = master.wait()
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
    summary = read_summary(report_dir)
    if returncode not in (0, 1) and summary.requests == 0:  # Locust exits 1 on any failure
        raise LoadError(f"locust exited with code {returncode}; see the output above")
    return summary


def read_summary(report_dir: Path) -> LoadSummary:
    stats = report_dir / "locust_stats.csv"
    if not stats.is_file():
        raise LoadError(f"locust wrote no statistics ({stats} is missing)")
    with stats.open() as handle:
        rows = {row["Name"]: row for row in csv.DictReader(handle)}
    if "Aggregated" not in rows:
        raise LoadError(f"{stats} has no Aggregated row")
    workers_file = report_dir / "workers.json"
    by_worker = json.loads(workers_file.read_text()) if workers_file.is_file() else {}

    def number(key: str, name: str = "Aggregated") -> float:
        text = rows.get(name, {}).get(key, "") or "0"
        return float(text) if text != "N/A" else 0.0

    named = [name for name in rows if name != "Aggregated"]
    short = next((name for name in named if name.endswith(" short")), None)
    long = next((name for name in named if name.endswith(" long")), None)
    return LoadSummary(
        requests=int(number("Request Count")) - int(number("Failure Count")),
        failures=int(number("Failure Count")),
        requests_per_s=number("Requests/s"),
        p50_ms=number("50%"),
        p99_ms=number("99%"),
        report_dir=report_dir,
        by_worker=by_worker,
        # Content size is the tokens a request sent where the requests are named by length.
        tokens_per_s=sum(number("Requests/s", n) * number("Average Content Size", n) for n in named)
        if short
        else 0.0,
        p99_short_ms=number("99%", short) if short else float("nan"),
        p99_long_ms=number("99%", long) if long else float("nan"),
    )


@dataclass
class WindowFigures:
    """What the requests that finished in one window of a run saw."""

    requests_per_s: float  # answered
    p99_ms: float  # of the answered ones (0 when none)
    failures: int


@dataclass
class RequestLog:
    """Every request of a run with `request_log` on: when it finished (Unix s), how long it took
    (ms), and whether it was answered; for figures over any window (a step's last seconds)."""

    finished_s: np.ndarray
    response_ms: np.ndarray
    ok: np.ndarray

    @classmethod
    def read(cls, report_dir: Path) -> RequestLog:
        files = sorted(report_dir.glob("requests-*.csv"))
        if not files:
            raise LoadError(f"no request log in {report_dir} (run with request_log on)")
        rows = np.concatenate(
            [np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2).reshape(-1, 3) for path in files]
        )
        return cls(rows[:, 0], rows[:, 1], rows[:, 2].astype(bool))

    def window(self, start_s: float, end_s: float) -> WindowFigures:
        inside = (self.finished_s >= start_s) & (self.finished_s < end_s)
        answered = self.response_ms[inside & self.ok]
        return WindowFigures(
            requests_per_s=answered.size / max(1e-9, end_s - start_s),
            p99_ms=float(np.percentile(answered, 99)) if answered.size else 0.0,
            failures=int(np.count_nonzero(inside & ~self.ok)),
        )
