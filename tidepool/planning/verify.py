"""`tidepool plan --verify`: the top candidates served side by side by one real tritonserver
(all loaded at start, in parallel), measured closed loop at every load level, levels taken in
turn across candidates so drift is shared, adaptively: one short window each, a second only for
the candidates whose order at that level is not clear, none for a candidate that cannot differ
there from one already measured (`same_at`); the pick meets the p99 budget
at the most levels, then has the best worst level: its throughput relative to the best seen at
that level."""

from __future__ import annotations

import csv
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tidepool.clients.sweep import LevelResult, Sweep, SweepSettings, rotated
from tidepool.configfile import copy_model, read_config
from tidepool.errors import TidepoolError
from tidepool.extras import pyplot
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.planning.config_writer import planned_config
from tidepool.planning.plan import VERIFY_LEVELS, VERIFY_WINDOW_S, Budgets, Plan

# Adaptive measurement. Each candidate serves every level for one window after LEVEL_WARM_UP_S;
# where the candidates within CLOSE of the best at that level are more than one (their order is
# not clear after one window), those take a second window and their mean counts, as does one
# over the p99 budget (a 1 s window's p99 is its few slowest requests: one stall moved a candidate
# from ~35 ms to 107 ms at one level of an encoder plan). Two fixed 2 s
# windows per candidate and level took 76 s of a 121 s encoder plan; with CLOSE at 10% most levels
# took second windows for every candidate (36 s of a 64 s plan).
CLOSE = 0.05
LEVEL_WARM_UP_S = 0.3
# Before the first level, each candidate serves this long at the top level, so that none meets its
# first measured level cold: in one convnet plan the candidate measured first after the loads
# (elastic, concurrency 1) served 41.7/s at p99 96 ms, under half of what it served in any other run.
WARM_UP_S = 0.5
# Candidates are served as plain `tritonserver` serves them, without the rate limiter that `tidepool
# serve` adds: most users start the server themselves, and a plan must not need the launcher to win.
VERIFY_RATE_LIMIT = "off"


class VerifyError(TidepoolError):
    """A candidate could not be served or measured."""


@dataclass
class LevelFigures:
    candidate: str
    concurrency: int
    throughput: float  # samples/s
    p50_ms: float
    p99_ms: float
    errors: int
    avg_batch: float
    meets_budget: bool


@dataclass
class Verification:
    candidates: list[Plan]
    figures: list[LevelFigures]
    chosen: int  # index into candidates
    seconds: float

    def of(self, label: str) -> list[LevelFigures]:
        return [f for f in self.figures if f.candidate == label]

    def table(self) -> str:
        levels = sorted({f.concurrency for f in self.figures})
        head = f"{'candidate':<28}" + "".join(f"{'c=' + str(c):>18}" for c in levels)
        lines = [head, " " * 28 + "".join(f"{'infer/s  p99 ms':>18}" for _ in levels)]
        for index, plan in enumerate(self.candidates):
            cells = "".join(
                f"{f.throughput:>9.1f}{f.p99_ms:>8.1f}{'' if f.meets_budget else '!':<1}"
                for f in self.of(plan.label)
            )
            mark = " <- chosen" if index == self.chosen else ""
            lines.append(f"{plan.label:<28}{cells}{mark}")
        return "\n".join(lines) + "\n(! = p99 over the latency budget at that level)"

    def header_notes(self) -> list[str]:
        """Lines for the config's comment header: what verification measured for the chosen plan."""
        chosen = self.candidates[self.chosen]
        cells = ", ".join(
            f"c={f.concurrency} {f.throughput:.0f}/s p99 {f.p99_ms:.0f} ms" for f in self.of(chosen.label)
        )
        others = "; ".join(p.label for i, p in enumerate(self.candidates) if i != self.chosen) or "none"
        return [
            f"Verified on a real server (tritonserver without --rate-limit, as started by hand) in "
            f"{self.seconds:.0f} s: {cells}.",
            f"Chosen over: {others} (meets the p99 budget at the most levels, then the best throughput "
            f"at its worst level against the best there; within {THROUGHPUT_TIE:.0%} of that, the lowest "
            "p99).",
        ]


# Worst-level throughputs this close are equal as far as one verification can tell (a window's
# run-to-run noise on these machines is 10-15%; the two-window mean halves little of it): between
# such candidates the lower tail decides.
THROUGHPUT_TIE = 0.05


def choose(candidates: Sequence[Plan], figures: Sequence[LevelFigures]) -> int:
    """Most levels within the p99 budget; then the best worst level (throughput / the best seen at
    that level); among those within THROUGHPUT_TIE of the best worst level, the lowest tail (p99 /
    the lowest p99 seen at each level, averaged over the levels); then the best worst level again.
    The worst level, because a config is judged at every load: one that is 0.7 of the best at
    concurrency 1 loses to one that is 0.9 everywhere, even where the first's mean is higher. The
    tail, because users choose on both: at equal throughput the lower p99 serves them better."""
    best: dict[int, float] = {}
    lowest_p99: dict[int, float] = {}
    for f in figures:
        best[f.concurrency] = max(best.get(f.concurrency, 0.0), f.throughput)
        lowest_p99[f.concurrency] = min(lowest_p99.get(f.concurrency, f.p99_ms), f.p99_ms)

    def scores(plan: Plan) -> tuple[int, float, float]:
        """Levels in budget, worst relative throughput, mean relative p99: each worked out once."""
        own = [f for f in figures if f.candidate == plan.label]
        relative = [f.throughput / best[f.concurrency] if best[f.concurrency] else 0.0 for f in own]
        tails = [f.p99_ms / lowest_p99[f.concurrency] if lowest_p99[f.concurrency] > 0 else 1.0 for f in own]
        return sum(f.meets_budget for f in own), min(relative, default=0.0), sum(tails) / max(1, len(tails))

    scored = [scores(plan) for plan in candidates]
    most = max(in_budget for in_budget, _, _ in scored)
    eligible = [i for i, (in_budget, _, _) in enumerate(scored) if in_budget == most]
    top = max(scored[i][1] for i in eligible)
    tied = [i for i in eligible if scored[i][1] >= top - THROUGHPUT_TIE]
    return min(tied, key=lambda i: (scored[i][2], -scored[i][1]))


def _closed_loop(
    url: str, name: str, level: int, window_s: float, warmup_s: float, lengths: str | None = None
) -> LevelResult:
    settings = SweepSettings(
        name, protocol="grpc", url=url, concurrency=(level,), window_s=window_s, warmup_s=warmup_s,
        max_windows=1, lengths=lengths,
    )  # fmt: skip
    [result] = Sweep(settings).run()
    return result


def _figures(candidate: Plan, level: int, results: Sequence[LevelResult], budgets: Budgets) -> LevelFigures:
    """One candidate at one level from its windows (means; errors added up)."""

    def mean(field: str) -> float:
        return statistics.fmean(getattr(r, field) for r in results)

    errors = sum(r.errors for r in results)
    return LevelFigures(
        candidate=candidate.label,
        concurrency=level,
        throughput=mean("throughput"),
        p50_ms=mean("p50_ms"),
        p99_ms=mean("p99_ms"),
        errors=errors,
        avg_batch=mean("avg_batch"),
        meets_budget=errors == 0 and mean("p99_ms") <= budgets.latency_ms,
    )


def same_at(level: int, one: Plan, other: Plan) -> bool:
    """Whether two candidates cannot differ at `level`: the same but for max_batch_size, and both
    at least `level`, which a closed loop of `level` clients never fills past (so every batch is
    the same under either)."""
    a, b = one.key, other.key
    return (
        replace(a, max_batch_size=0) == replace(b, max_batch_size=0)
        and min(a.max_batch_size, b.max_batch_size) >= level
    )


def unclear(results: dict[str, list[LevelResult]], latency_ms: float) -> list[str]:
    """The candidates one window does not settle at a level: those within CLOSE of the best there,
    where there is more than one (their order is not clear), and any over the p99 budget (one stall
    in a short window must not rule a candidate out on its own)."""
    means = {name: statistics.fmean(r.throughput for r in runs) for name, runs in results.items()}
    best = max(means.values(), default=0.0)
    close = [name for name, mean in means.items() if mean >= (1 - CLOSE) * best]
    over = [name for name, runs in results.items() if runs[-1].p99_ms > latency_ms]
    return list(dict.fromkeys((close if len(close) > 1 else []) + over))


def verify(
    model_dir: Path,
    candidates: Sequence[Plan],
    budgets: Budgets,
    levels: Sequence[int] = VERIFY_LEVELS,
    window_s: float = VERIFY_WINDOW_S,
    progress: Callable[[str], None] = lambda text: None,
) -> Verification:
    began = time.perf_counter()
    base = read_config(model_dir / "config.pbtxt")
    # Every candidate is sent the same traffic: the length mix planned for, where there is one.
    mix = next((c.lengths.mix.text for c in candidates if c.lengths is not None), None)
    names = [f"{base.name or model_dir.name}__{i}" for i in range(len(candidates))]
    with tempfile.TemporaryDirectory(prefix="tidepool-verify-") as tmp:
        repository = Path(tmp)
        for name, candidate in zip(names, candidates, strict=True):
            copy_model(model_dir, repository / name, planned_config(base, candidate))
        # Every candidate loaded as the server starts: Triton loads them in parallel.
        server_config = ServerConfig.on_free_ports(
            repository, model_control="explicit", rate_limit=VERIFY_RATE_LIMIT
        )
        figures: list[LevelFigures] = []
        progress(f"starting a server with {len(candidates)} candidates")
        try:
            server = TritonServer(server_config).start()
        except TidepoolError as exc:
            raise VerifyError(f"the candidates could not be served: {exc}") from None
        try:
            url = server_config.grpc_url
            pairs = list(zip(names, candidates, strict=True))
            by_name = dict(pairs)
            for name, candidate in pairs:
                progress(f"warming up {candidate.label} at c={max(levels)}")
                _closed_loop(url, name, max(levels), WARM_UP_S / 2, WARM_UP_S / 2, mix)
            for index, level in enumerate(levels):
                runs: dict[str, list[LevelResult]] = {}
                twins: dict[str, str] = {}  # candidate -> the one measured for it at this level
                for name, candidate in rotated(pairs, index):
                    twin = next((n for n in runs if same_at(level, by_name[n], candidate)), None)
                    if twin is not None:
                        twins[name] = twin
                        continue
                    progress(f"c={level}: {candidate.label}")
                    runs[name] = [_closed_loop(url, name, level, window_s, LEVEL_WARM_UP_S, mix)]
                for name in unclear(runs, budgets.latency_ms):
                    progress(f"c={level}: {by_name[name].label} again (close to the best or over budget)")
                    runs[name].append(_closed_loop(url, name, level, window_s, 0.0, mix))
                measured = {name: runs[twins.get(name, name)] for name in names}
                figures += [_figures(candidate, level, measured[name], budgets) for name, candidate in pairs]
        finally:
            server.kill()  # nothing in flight: a drain and unload would only add seconds
    return Verification(list(candidates), figures, choose(candidates, figures), time.perf_counter() - began)


def write_verification(verification: Verification, out_dir: Path, title: str) -> list[Path]:
    """The per-level table as CSV, and a PNG: throughput and p99 against concurrency per candidate."""
    plt = pyplot()

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "verification.csv"
    rows = [asdict(f) for f in verification.figures]
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    for index, plan in enumerate(verification.candidates):
        own = verification.of(plan.label)
        label = plan.label + (" (chosen)" if index == verification.chosen else "")
        top.plot([f.concurrency for f in own], [f.throughput for f in own], marker="o", label=label)
        bottom.plot([f.concurrency for f in own], [f.p99_ms for f in own], marker="o", label=label)
    top.set_ylabel("throughput (samples/s)")
    bottom.set_ylabel("p99 latency (ms)")
    bottom.set_xlabel("concurrency (closed loop)")
    for axes in (top, bottom):
        axes.set_xscale("log", base=2)
        axes.grid(alpha=0.3)
    top.legend(fontsize=8)
    top.set_title(title)
    figure.tight_layout()
    png_path = out_dir / "verification.png"
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return [csv_path, png_path]
