"""What `tidepool profile` and `tidepool plan` run, behind typed settings: how to measure a model,
which profiles a plan chooses from, the ranked candidates, verification on a real server, and the
config written. The command line only builds the settings; what a run says goes to `say` (the
report, on stdout) and `progress` (on stderr)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tidepool.planning.candidates import candidates, precisions_to_try, thread_splits, to_verify
from tidepool.planning.config_writer import write_plan
from tidepool.planning.plan import VERIFY_LEVELS, VERIFY_WINDOW_S, Budgets, Plan, PlanError
from tidepool.planning.profile import PROFILE_BATCH_SIZES, SECONDS_PER_POINT, Profile
from tidepool.pool import MemoryPool

Say = Callable[[str], None]


def _silent(text: str) -> None:
    pass


@dataclass(frozen=True)
class Measuring:
    """How a profile is measured: batch sizes doubled until the latency or memory limit, on a
    device, each timed for about `seconds_per_point`."""

    batch_sizes: tuple[int, ...] = PROFILE_BATCH_SIZES
    device: str = "cpu"
    seconds_per_point: float = SECONDS_PER_POINT
    max_latency_ms: float | None = None  # stop doubling past this p99
    memory_limit_bytes: int | None = None  # stop doubling past this total

    def profile(
        self,
        model_dir: Path,
        precision: str = "fp32",
        threads: int | None = None,
        graph: str = "eager",
        trace: Path | None = None,
        known_output_difference: dict[str, float] | None = None,
        latency_budget_ms: float | None = None,
        progress: Say = _silent,
    ) -> Profile:
        """One profile; a plan's stops doubling past its latency budget (no larger batch can serve
        within it) unless `max_latency_ms` says otherwise."""
        from tidepool.planning.profiler import profile_model  # torch loads here, not before

        return profile_model(
            model_dir,
            self.batch_sizes,
            device=self.device,
            precision=precision,
            torch_threads=threads,
            graph=graph,
            max_latency_ms=self.max_latency_ms or latency_budget_ms,
            memory_limit_bytes=self.memory_limit_bytes,
            max_seconds_per_point=self.seconds_per_point,
            trace_path=trace,
            progress=progress,
            known_output_difference=known_output_difference,
        )


@dataclass(frozen=True)
class PlanSettings:
    """One `tidepool plan`: the model, its budgets, where its profiles come from, and what is done
    with the ranked candidates."""

    model_dir: Path
    budgets: Budgets
    measuring: Measuring = field(default_factory=Measuring)
    saved_profiles: tuple[Path, ...] = ()  # none: profile now
    threads_to_try: tuple[int, ...] = ()  # none: each split of the cores (the device's cores on a GPU)
    verify: bool = False
    verify_top: int = 3
    levels: tuple[int, ...] = VERIFY_LEVELS
    window_s: float = VERIFY_WINDOW_S
    report_dir: Path | None = None  # default: reports/plan-MODEL-TIME
    write: bool = False
    node_share: NodeShare | None = None  # planned together with the repository's other models


@dataclass(frozen=True)
class NodeShare:
    """This model's part of a node memory budget that the models of one repository share: its
    budgets' memory, and the floors (POOL_INITIAL_BYTES, which its pools never lend) fit in it."""

    share_bytes: int
    note: str  # for the config's header: the budget, who shares it, and why this share


def repository_models(directory: Path) -> list[Path]:
    """The model to plan: `directory` itself where it holds a config.pbtxt, else every model
    directory in it (a repository, planned together)."""
    if (directory / "config.pbtxt").is_file():
        return [directory]
    if not directory.is_dir():
        raise PlanError(f"{directory} is not a directory")
    models = sorted(p for p in directory.iterdir() if (p / "config.pbtxt").is_file())
    if not models:
        raise PlanError(f"{directory} is neither a model directory nor a repository (no config.pbtxt)")
    return models


def node_shares(models: Sequence[Path], budget_bytes: int, budget_text: str) -> dict[Path, NodeShare]:
    """An even split of the node budget among the models of a repository: each is planned with its
    share, so that whatever each plan holds at its floor, all fit beside each other."""
    share = budget_bytes // len(models)
    names = ", ".join(model.name for model in models)
    return {
        model: NodeShare(
            share,
            f"Node budget: {budget_text} for {len(models)} models planned together ({names}); this one's "
            f"share {share / 2**20:.0f} MiB, an even split, holds its floors (POOL_INITIAL_BYTES, "
            "never lent) and its memory budget above.",
        )
        for model in models
    }


def fit_floors(plan: Plan, share_bytes: int) -> None:
    """Cap POOL_INITIAL_BYTES where the instances' floors (each the power of two a pool reserves
    at start) would pass the model's share of the node budget; the pools borrow the rest."""
    if plan.instance_count * MemoryPool.initial_arena_bytes(plan.pool_initial_bytes) <= share_bytes:
        return
    per_instance = share_bytes // plan.instance_count
    capped = 1 << (per_instance.bit_length() - 1) if per_instance > 0 else 0
    plan.pool_initial_bytes = capped
    plan.reasons["pool_initial_bytes"] = (
        plan.reasons.get("pool_initial_bytes", "")
        + f"; capped at {capped / 2**20:.0f} MiB so that {plan.instance_count} floors fit this model's "
        "share of the node budget (above it the pools borrow what others lend)"
    )


# `tidepool plan --write` keeps the profiles it planned from beside the config it writes, so that a
# re-plan of a live server (`--from-server`) plans from them instead of profiling on a machine that
# serves meanwhile (a profile taken under a closed loop of 4 clients measured 443 ms at p99 for
# batch 1, against 9-19 ms idle). Triton takes only numbered folders of a model as versions.
PROFILES_DIRECTORY = "profiles"
PROFILES_NOTE = (
    f"Profiles: {PROFILES_DIRECTORY}/ beside this file, what `tidepool plan --from-server` re-plans from "
    "without profiling again."
)


def profile_file_name(profile: Profile) -> str:
    return f"{profile.device}-{profile.precision}-{profile.graph}-{profile.torch_threads}t.json"


def save_profiles(model_dir: Path, profiles: Sequence[Profile]) -> Path:
    """The profiles as JSON in MODEL_DIR/profiles/, replacing what an earlier plan saved there."""
    directory = model_dir / PROFILES_DIRECTORY
    directory.mkdir(exist_ok=True)
    for stale in directory.glob("*.json"):
        stale.unlink()
    for profile in profiles:
        (directory / profile_file_name(profile)).write_text(profile.to_json())
    return directory


def saved_profile_paths(model_dir: Path) -> tuple[Path, ...]:
    """The profiles `tidepool plan --write` saved for this model, or none."""
    return tuple(sorted((model_dir / PROFILES_DIRECTORY).glob("*.json")))


def gather_profiles(settings: PlanSettings, say: Say = _silent, progress: Say = _silent) -> list[Profile]:
    """The saved profiles, or new ones: fp32 at every split of the cores, and each lower precision
    and the frozen graph where their screens keep them (screens.profiles_to_plan)."""
    if settings.saved_profiles:
        return [Profile.read(path) for path in settings.saved_profiles]
    from tidepool.planning.screens import profiles_to_plan

    budgets, measuring, model_dir = settings.budgets, settings.measuring, settings.model_dir
    splits = list(settings.threads_to_try) or (
        thread_splits(budgets.cores) if measuring.device == "cpu" else [budgets.cores]
    )
    precisions = precisions_to_try(measuring.device, budgets.max_output_error)
    progress(f"profiling {model_dir.name}: threads {splits} x precisions {precisions}")
    profiles, screens, graph_screen = profiles_to_plan(
        model_dir, splits, precisions, budgets.max_output_error,
        lambda precision, threads, known, graph: measuring.profile(
            model_dir, precision, threads, graph, known_output_difference=known,
            latency_budget_ms=budgets.latency_ms, progress=progress,
        ),
        device=measuring.device, progress=progress,
    )  # fmt: skip
    progress("")
    say(f"graph: {graph_screen.reason}")
    for screen in screens:
        say(f"{screen.precision}: {screen.reason}" + ("" if screen.kept else "; not profiled"))
    return profiles


@dataclass
class PlanOutcome:
    chosen: Plan | None  # None: no candidate meets the budgets (`impossible` says why)
    impossible: str = ""
    written: Path | None = None


def plan_model(
    settings: PlanSettings,
    profiles: Sequence[Profile],
    say: Say = _silent,
    progress: Say = _silent,
    began: float | None = None,
) -> PlanOutcome:
    """Rank the candidates, verify the top ones where asked, and write the chosen one where asked.
    `began` (time.perf_counter) is when planning started, profiling included: now by default."""
    began = time.perf_counter() if began is None else began
    model_dir, budgets = settings.model_dir, settings.budgets
    try:
        ranked, left_out = candidates(list(profiles), budgets)
    except PlanError as exc:
        return PlanOutcome(None, str(exc))
    for reason in left_out:
        say(f"left out: {reason}")
    say(f"candidates for {model_dir.name}, best predicted first:")
    for plan in ranked:
        say(f"  {plan.label:<28} predicted {plan.predicted_throughput:.0f} samples/s, "
            f"lone request {plan.lone_latency_ms:.1f} ms")  # fmt: skip
    chosen, notes = ranked[0], []
    if settings.verify:
        from tidepool.planning.verify import verify, write_verification

        top = to_verify(ranked, settings.verify_top, budgets)
        verification = verify(model_dir, top, budgets, settings.levels, settings.window_s, progress=progress)
        progress("")
        say(verification.table())
        report_dir = settings.report_dir or Path(
            f"reports/plan-{model_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        written = write_verification(verification, report_dir, f"{model_dir.name}: verified candidates")
        say("wrote " + ", ".join(str(p) for p in written))
        chosen, notes = top[verification.chosen], verification.header_notes()
    if settings.node_share is not None:
        fit_floors(chosen, settings.node_share.share_bytes)
        notes = [*notes, settings.node_share.note]
    say(f"plan for {model_dir.name} ({chosen.label}), planned in {time.perf_counter() - began:.0f} s:")
    say(chosen.describe())
    outcome = PlanOutcome(chosen)
    if settings.write:
        save_profiles(model_dir, profiles)
        outcome.written = write_plan(model_dir, budgets, chosen, [*notes, PROFILES_NOTE])
        say(f"wrote {outcome.written} and the profiles it was planned from in {PROFILES_DIRECTORY}/")
    else:
        say("(dry run: --write writes config.pbtxt)")
    return outcome
