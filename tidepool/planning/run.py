"""What `tidepool profile` and `tidepool plan` run, behind typed settings: how to measure a model,
which profiles a plan chooses from, the ranked candidates, verification on a real server, the
config written, and a repository's models planned one by one with shares of one node budget. The
command line only builds the settings; what a run says goes to `say` (the report, on stdout) and
`progress` (on stderr)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tidepool.configfile import read_config_dict
from tidepool.planning.candidates import candidates, precisions_to_try, thread_splits, to_verify
from tidepool.planning.config_writer import write_plan
from tidepool.planning.lengths import with_lengths
from tidepool.planning.plan import VERIFY_LEVELS, VERIFY_WINDOW_S, Budgets, Plan, PlanError
from tidepool.planning.profile import PROFILE_BATCH_SIZES, SECONDS_PER_POINT, Profile
from tidepool.planning.together import NodeShare, fit_floors, node_shares
from tidepool.sequences import Sequences
from tidepool.spec import LengthMix, parse_model_config

if TYPE_CHECKING:
    from tidepool.planning.lengths import LengthPlan
    from tidepool.planning.profiler import Samples

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
    inputs: Path | None = None  # real samples (.npz or .json) to measure on; None: generated ones
    lengths: str | None = None  # a length mix (--lengths); None: the config's LENGTH_MIX or the samples'

    def samples(self, model_dir: Path) -> Samples | None:
        from tidepool.planning.profiler import read_samples

        return read_samples(self.inputs, model_dir) if self.inputs else None

    def mix(self, model_dir: Path) -> LengthMix | None:
        """The length mix to plan a model with sequence inputs for: --lengths, else the config's
        LENGTH_MIX, else the lengths of the --inputs samples where they differ; None: one length."""
        model = parse_model_config(read_config_dict(model_dir / "config.pbtxt"))
        sequences = Sequences.of(model)
        if sequences is None:
            return None
        if self.lengths:
            return LengthMix.parse(self.lengths, "--lengths")
        if sequences.mix is not None:
            return sequences.mix
        lengths = [sequences.length(sample, model.batched) for sample in self.samples(model_dir) or []]
        return LengthMix.from_lengths(lengths) if len(set(lengths)) > 1 else None

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
        length: int | None = None,
    ) -> Profile:
        """One profile; a plan's stops doubling past its latency budget (no larger batch can serve
        within it) unless `max_latency_ms` says otherwise. Sequence inputs at `length` where given."""
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
            samples=self.samples(model_dir),
            length=length,
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
    precisions = precisions_to_try(measuring.device, budgets.quality)
    mix = measuring.mix(model_dir)
    length = round(mix.mean) if mix else None  # the batch profiles at the mix's mean length
    progress(f"profiling {model_dir.name}: threads {splits} x precisions {precisions}")
    profiles, screens, graph_screen = profiles_to_plan(
        model_dir, splits, precisions, budgets.quality,
        lambda precision, threads, known, graph: measuring.profile(
            model_dir, precision, threads, graph, known_output_difference=known,
            latency_budget_ms=budgets.latency_ms, progress=progress, length=length,
        ),
        device=measuring.device, progress=progress, samples=measuring.samples(model_dir),
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
    lengths = planned_for_lengths(settings, ranked, say, progress)
    if lengths is not None:
        ranked = [with_lengths(plan, lengths) for plan in ranked]
    say(f"candidates for {model_dir.name}, best predicted first:")
    for plan in ranked:
        say(f"  {plan.label:<28} predicted {plan.predicted_throughput:.0f} samples/s, "
            f"lone request {plan.lone_latency_ms:.1f} ms")  # fmt: skip
    chosen, notes = ranked[0], []
    if settings.verify:
        from tidepool.planning.verify import verify, write_verification

        top = to_verify(ranked, settings.verify_top, budgets)
        if lengths is not None:  # a plan made for verification (a shared batch) serves the mix too
            top = [plan if plan.lengths else with_lengths(plan, lengths) for plan in top]
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


def planned_for_lengths(
    settings: PlanSettings, ranked: list[Plan], say: Say, progress: Say
) -> LengthPlan | None:
    """For a model with sequence inputs and a length mix: the settings that serve that mix
    (planning/lengths.py), from a profile over rows x length of the best candidate, measured now
    unless it was saved with the profiles. None where requests of different lengths cannot share a
    pass (the check says why) or there is no mix."""
    from tidepool.planning.lengths import lengths_to_measure, plan_lengths

    model_dir, measuring = settings.model_dir, settings.measuring
    mix = measuring.mix(model_dir)
    model = parse_model_config(read_config_dict(model_dir / "config.pbtxt"))
    sequences = Sequences.of(model)
    if mix is None or sequences is None:
        if sequences is not None:
            say("lengths: planned for one length (shape.<INPUT>); --lengths plans for a length mix")
        return None
    profile = ranked[0].profile
    assert profile is not None
    if not profile.length_points:
        if settings.saved_profiles:
            say("lengths: the saved profiles hold no length profile; plan without --profile to measure one")
            return None
        from tidepool.planning.profiler import profile_lengths

        budget_ms, seconds = settings.budgets.latency_ms, measuring.seconds_per_point
        measured = profile_lengths(model_dir, profile, lengths_to_measure(mix), budget_ms, seconds, progress)
        profile.length_points, profile.unpadded_because = measured.length_points, measured.unpadded_because
        progress("")
    if profile.unpadded_because:
        say(f"lengths: requests of different lengths run apart: {profile.unpadded_because}")
        return None
    planned = plan_lengths(
        profile.length_points,
        mix,
        sequences,
        settings.budgets,
        ranked[0].max_batch_size,
        profile.static_bytes,
    )
    say(f"lengths: {planned.header()[0]}")
    return planned


def plan_repository(
    settings: PlanSettings,
    models: Sequence[Path],
    budget_text: str,
    say: Say = _silent,
    progress: Say = _silent,
) -> list[str]:
    """Every model of a repository planned with an even share of the node budget (`settings.budgets`'
    memory), from the profiles saved beside it where `plan --write` left some; returns why each model
    that could not be planned could not."""
    began = time.perf_counter()
    shares = node_shares(models, settings.budgets.memory_bytes, budget_text)
    impossible = []
    for model in models:
        share = shares[model]
        say(f"== {model.name}: {share.share_bytes / 2**20:.0f} MiB of the node budget {budget_text}")
        saved = saved_profile_paths(model)
        if saved:
            say(f"planning from the {len(saved)} profiles `tidepool plan --write` saved beside it")
        one = replace(
            settings,
            model_dir=model,
            saved_profiles=saved,
            budgets=replace(settings.budgets, memory_bytes=share.share_bytes),
            node_share=share,
            report_dir=settings.report_dir / model.name if settings.report_dir else None,
        )
        outcome = plan_model(one, gather_profiles(one, say, progress), say, progress, began)
        if outcome.chosen is None:
            impossible.append(f"{model.name}: {outcome.impossible}")
    return impossible
