"""`tidepool plan`: batcher settings from profiles and budgets, for one model, a repository's models
together, or the traffic a live server sees."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from tidepool.commands.common import add_measuring_options, duration, int_list, measuring, progress_printer
from tidepool.errors import TidepoolError
from tidepool.machine import usable_cores


def add(commands: Any) -> None:
    plan = commands.add_parser("plan", help="choose batcher settings from a profile and budgets")
    plan.add_argument(
        "model_dir",
        metavar="MODEL_DIR",
        help="a model directory, or a repository: every model in it, planned together",
    )
    plan.add_argument(
        "--memory-budget",
        required=True,
        metavar="SIZE",
        help="e.g. 2GiB, or host=2GiB,cuda:0=10GiB; for a repository, the node budget its models share "
        "(each planned with an even share, its floors within it)",
    )
    plan.add_argument("--latency-budget-ms", type=float, required=True)
    plan.add_argument("--headroom", type=float, default=0.8, help="share of the memory budget to use")
    _add_candidate_flags(plan)
    _add_verification_flags(plan)
    _add_live_flags(plan)
    plan.add_argument("--write", action="store_true", help="write config.pbtxt (default: print only)")
    add_measuring_options(plan)
    plan.set_defaults(run=run)


def _add_candidate_flags(plan: argparse.ArgumentParser) -> None:
    """What the plan chooses among: cores, profiles, thread splits, precisions, elastic threads."""
    plan.add_argument("--cores", type=int, help="CPU cores for instances (default: this machine's)")
    plan.add_argument(
        "--profile",
        action="append",
        help="a profile JSON from `tidepool profile`; repeat for several thread counts or precisions "
        "(default: profile now, at every split of the cores and every precision allowed)",
    )
    plan.add_argument(
        "--threads-to-try",
        type=int_list,
        metavar="T1,T2",
        help="torch threads per instance to profile (default: each split of the cores)",
    )
    quality = plan.add_argument_group(
        "what a lower precision must keep of fp32's outputs (none given: fp32 only)"
    )
    quality.add_argument(
        "--max-output-error",
        type=float,
        default=0.0,
        help="largest max-abs difference from fp32's outputs",
    )
    quality.add_argument(
        "--min-cosine",
        type=float,
        help="least cosine similarity of an output's rows to fp32's, e.g. 0.999 for embeddings",
    )
    quality.add_argument(
        "--min-top1",
        type=float,
        help="least share of rows whose top-1 class agrees with fp32's, e.g. 0.99 for a classifier",
    )
    quality.add_argument(
        "--quality-output",
        metavar="NAME",
        help="the output --min-cosine and --min-top1 judge (default: every one)",
    )
    plan.add_argument(
        "--bounded-queue",
        action="store_true",
        help="also write the queue policy (max_queue_size, REJECT after the latency budget); "
        "off by default, see docs/planning.md",
    )
    plan.add_argument(
        "--elastic-threads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also plan CPU instances that share the cores among those busy (ELASTIC_THREADS; "
        "see docs/planning.md; default: on)",
    )


def _add_verification_flags(plan: argparse.ArgumentParser) -> None:
    from tidepool.planning.plan import VERIFY_LEVELS, VERIFY_WINDOW_S

    plan.add_argument(
        "--verify",
        action="store_true",
        help="serve the top candidates on a real server; pick by measured throughput and p99 at each level",
    )
    plan.add_argument("--verify-top", type=int, default=3, help="candidates to verify (default: %(default)s)")
    plan.add_argument(
        "--levels",
        type=int_list,
        default=list(VERIFY_LEVELS),
        help=f"closed-loop concurrency levels (default: {','.join(map(str, VERIFY_LEVELS))})",
    )
    plan.add_argument(
        "--verify-window", "--window-s", dest="window_s", type=duration, default=VERIFY_WINDOW_S,
        help="--verify's measurement window per level, e.g. 2s (default: %(default)s s)",
    )  # fmt: skip
    plan.add_argument(
        "--report-dir", help="where --verify writes its CSV and PNG (default: reports/plan-...)"
    )


def _add_live_flags(plan: argparse.ArgumentParser) -> None:
    live = plan.add_argument_group("re-planning from a live server")
    live.add_argument(
        "--from-server",
        metavar="URL",
        help="the live server: HOST:PORT or http://HOST:PORT (HTTP), grpc://HOST:PORT (gRPC); re-plan "
        "for its traffic, from the profiles `plan --write` saved beside the config",
    )
    live.add_argument("--model", help="the model's name on the server (default: the model directory's name)")
    live.add_argument(
        "--window", type=duration, default=60.0, help="traffic per observation, e.g. 10s, 2m (default: 60s)"
    )
    live.add_argument(
        "--apply",
        action="store_true",
        help="load a changed config into the server (serve it with --model-control explicit)",
    )
    live.add_argument("--watch", action="store_true", help="observe and re-plan every window until stopped")


def warn(text: str) -> None:
    print(text, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from tidepool.planning.plan import Budgets
    from tidepool.planning.quality import QualityBudget
    from tidepool.planning.run import PlanSettings, gather_profiles, plan_model, plan_repository
    from tidepool.planning.together import repository_models, tier_budget

    began = time.perf_counter()
    models = repository_models(Path(args.model_dir))
    memory, budget_text = tier_budget(args.memory_budget, args.device)
    settings = PlanSettings(
        model_dir=models[0],
        budgets=Budgets(
            memory_bytes=memory,
            latency_ms=args.latency_budget_ms,
            headroom=args.headroom,
            cores=args.cores or usable_cores(),
            bounded_queue=args.bounded_queue,
            quality=QualityBudget(args.max_output_error, args.min_cosine, args.min_top1, args.quality_output),
            elastic_threads=args.elastic_threads,
        ),
        measuring=measuring(args),
        saved_profiles=tuple(Path(path) for path in args.profile or ()),
        threads_to_try=tuple(args.threads_to_try or ()),
        verify=args.verify,
        verify_top=args.verify_top,
        levels=tuple(args.levels),
        window_s=args.window_s,
        report_dir=Path(args.report_dir) if args.report_dir else None,
        write=args.write,
    )
    if len(models) > 1:
        if args.from_server or args.profile:
            raise TidepoolError(
                "a repository is planned model by model: --from-server and --profile take one model"
            )
        impossible = plan_repository(settings, models, budget_text, say=print, progress=progress_printer)
        for reason in impossible:
            warn(f"tidepool plan: impossible: {reason}")
        return 2 if impossible else 0
    if args.from_server:
        from tidepool.planning.live import LiveSettings, profiles_for_live, replan_from_server

        model = args.model or settings.model_dir.name
        live = LiveSettings(args.from_server, model, args.window, args.apply, args.watch)
        if not settings.saved_profiles:
            settings = profiles_for_live(settings, live, say=print, warn=warn)
        profiles = gather_profiles(settings, say=print, progress=progress_printer)
        return replan_from_server(settings, live, profiles, say=lambda text: print(text, flush=True))
    profiles = gather_profiles(settings, say=print, progress=progress_printer)
    outcome = plan_model(settings, profiles, say=print, progress=progress_printer, began=began)
    if outcome.chosen is None:
        warn(f"tidepool plan: impossible: {outcome.impossible}. Nothing was written.")
        return 2
    return 0
