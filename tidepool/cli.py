"""`tidepool` subcommands; each parses its flags and calls into the package that owns the work.
Any TidepoolError (and an unreachable server) ends as one line on stderr, never a traceback."""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidepool.errors import TidepoolError
from tidepool.machine import usable_cores
from tidepool.spec import parse_bytes, parse_duration, positive_ints

if TYPE_CHECKING:  # the commands import their parts when run
    from tidepool.planning.live import LiveSettings
    from tidepool.planning.run import PlanSettings


def progress_printer(text: str) -> None:
    """Progress of long work on stderr: one line rewritten in place on a terminal."""
    end = "\r" if sys.stderr.isatty() else "\n"
    print(f"{text:<90}", end=end, file=sys.stderr, flush=True)


def duration(text: str) -> float:
    """An argparse type: '10s', '500ms', '5m' or a plain number of seconds -> seconds."""
    try:
        return parse_duration(text, "duration")
    except TidepoolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def int_list(text: str) -> list[int]:
    """An argparse type: '1,2,4' -> [1, 2, 4], each at least 1."""
    try:
        return positive_ints(text, "a list", example="1,2,4")
    except TidepoolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_measuring_options(parser: argparse.ArgumentParser) -> None:
    from tidepool.planning.profile import PROFILE_BATCH_SIZES, SECONDS_PER_POINT

    parser.add_argument(
        "--batch-sizes",
        type=int_list,
        default=list(PROFILE_BATCH_SIZES),
        metavar="B1,B2",
        help=f"default: {','.join(map(str, PROFILE_BATCH_SIZES))}",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--max-latency-ms", type=float, help="stop doubling past this p99")
    parser.add_argument("--memory-limit", help="stop doubling past this total, e.g. 4GiB")
    parser.add_argument(
        "--seconds-per-point",
        type=float,
        default=SECONDS_PER_POINT,
        help="time each batch size for about this long, at least 10 passes (default: %(default)s)",
    )


def _measuring(args: argparse.Namespace) -> Any:
    from tidepool.planning.run import Measuring

    return Measuring(
        batch_sizes=tuple(args.batch_sizes),
        device=args.device,
        seconds_per_point=args.seconds_per_point,
        max_latency_ms=args.max_latency_ms,
        memory_limit_bytes=parse_bytes(args.memory_limit, "--memory-limit") if args.memory_limit else None,
    )


def _serve(args: argparse.Namespace) -> int:
    from tidepool.launcher.serve import serve
    from tidepool.launcher.server import ServerConfig
    from tidepool.pool.budget import BUDGET_VARIABLE, budget_for, format_budget, parse_budget

    environment = {}
    if args.memory_budget:
        environment[BUDGET_VARIABLE] = format_budget(parse_budget(args.memory_budget, "--memory-budget"))
    host = budget_for("host", {**os.environ, **environment})
    print(f"tidepool: node memory budget host={host.nbytes / 2**30:.2f}GiB ({host.why})", file=sys.stderr)
    return serve(
        ServerConfig(
            model_repository=Path(args.model_repository),
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            tritonserver=args.tritonserver,
            backend_config=args.backend_config,
            log_verbose=args.log_verbose,
            grace_s=args.grace_s,
            model_control=args.model_control,
            rate_limit=args.rate_limit,
            environment=environment,
        )
    )


def _add_serve(commands: Any) -> None:
    from tidepool.launcher.server import DEFAULT_GRACE_S, ServerConfig

    defaults = ServerConfig()
    serve = commands.add_parser("serve", help="start tritonserver on a model repository")
    serve.add_argument(
        "--model-repository",
        default=str(defaults.model_repository),
        metavar="DIR",
        help="models to serve (default: %(default)s)",
    )
    serve.add_argument(
        "--host",
        default=defaults.host,
        help="address to listen on for HTTP, gRPC and metrics (default: "
        "%(default)s, loopback only; 0.0.0.0 listens on every interface)",
    )
    serve.add_argument("--http-port", type=int, default=defaults.http_port)
    serve.add_argument("--grpc-port", type=int, default=defaults.grpc_port)
    serve.add_argument("--metrics-port", type=int, default=defaults.metrics_port)
    serve.add_argument(
        "--tritonserver",
        metavar="PATH",
        help="tritonserver binary (default: $TRITONSERVER, PATH, then the nvidia-pytriton wheel)",
    )
    serve.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="BACKEND,K=V",
        help="passed to tritonserver, e.g. python,shm-default-byte-size=33554432",
    )
    serve.add_argument("--log-verbose", type=int, default=defaults.log_verbose)
    serve.add_argument(
        "--model-control",
        choices=["none", "explicit"],
        default=defaults.model_control,
        help="explicit: load every model at start and allow reloads with a new config "
        "(tidepool plan --from-server --apply)",
    )
    serve.add_argument(
        "--rate-limit",
        choices=["execution_count", "off"],
        default=defaults.rate_limit,
        help="Triton's rate limiter; execution_count lets the rate-limiter priorities of an elastic "
        "plan keep a lone client on one instance (default: %(default)s)",
    )
    serve.add_argument(
        "--memory-budget",
        metavar="TIER=SIZE,...",
        help="what the pools of every model share, e.g. host=8GiB,cuda:0=20GiB (sets "
        "TIDEPOOL_MEMORY_BUDGET for the server; default: 80%% of the machine's or device's memory)",
    )
    serve.add_argument(
        "--grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        help="on SIGTERM or Ctrl-C, drain for up to this long, then kill (default: %(default)s, "
        "inside Kubernetes' 30 s default)",
    )
    serve.set_defaults(run=_serve)


def _install_backend(args: argparse.Namespace) -> int:
    from tidepool.launcher.install import install_backend

    installation = install_backend(Path(args.directory), args.tritonserver)
    print(installation.describe(args.model_repository))
    return 0


def _add_install_backend(commands: Any) -> None:
    install = commands.add_parser(
        "install-backend",
        help="lay out the tidepool backend in a tritonserver backend directory, for plain tritonserver",
        description="Write DIR/tidepool/model.py (and, where DIR has no Python backend, Triton's "
        "Python backend for this interpreter), then print the tritonserver command line that serves "
        "a model repository with it. In NVIDIA's container: DIR is /opt/tritonserver/backends.",
    )
    install.add_argument("directory", metavar="DIR", help="the backend directory (created where missing)")
    install.add_argument(
        "--tritonserver",
        metavar="PATH",
        help="the tritonserver to serve with (default: $TRITONSERVER, PATH, then the nvidia-pytriton wheel)",
    )
    install.add_argument(
        "--model-repository",
        default="model_repository",
        metavar="DIR",
        help="the repository the printed command line serves (default: %(default)s)",
    )
    install.set_defaults(run=_install_backend)


def _infer(args: argparse.Namespace) -> int:
    from tidepool.clients.infer import infer_once

    result = infer_once(args.model, protocol=args.protocol, url=args.url, seed=args.seed)
    print(result.describe())
    return 0


def _add_infer(commands: Any) -> None:
    infer = commands.add_parser("infer", help="send one valid random request and print the result")
    infer.add_argument("model")
    infer.add_argument("--protocol", choices=["http", "grpc"], default="http")
    infer.add_argument(
        "--url", help="server address (default: 127.0.0.1:8000 for HTTP, 127.0.0.1:8001 for gRPC)"
    )
    infer.add_argument("--seed", type=int, default=0, help="seed of the random input")
    infer.set_defaults(run=_infer)


def _sweep(args: argparse.Namespace) -> int:
    from tidepool.clients.sweep import (
        Sweep,
        SweepSettings,
        format_table,
        parse_levels,
        write_reports,
    )

    rates = tuple(float(r) for r in args.request_rate.split(",")) if args.request_rate else ()
    settings = SweepSettings(
        model=args.model,
        protocol=args.protocol,
        url=args.url,
        batch=args.batch,
        concurrency=tuple(parse_levels(args.concurrency)),
        request_rates=rates,
        window_s=args.duration_s,
        warmup_s=args.warmup_s,
        max_windows=args.max_windows,
        shared_memory=args.shared_memory,
        input_file=args.input_data,
    )
    results = Sweep(settings, progress=progress_printer).run()
    print(f"\n{args.model} over {args.protocol}, batch {args.batch}:")
    print(format_table(results))
    if args.out:
        written = write_reports(
            results, Path(args.out), f"{args.model} ({args.protocol}, batch {args.batch})"
        )
        print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _add_sweep(commands: Any) -> None:
    sweep = commands.add_parser(
        "sweep", help="measure throughput and latency level by level (closed-loop or open-loop)"
    )
    sweep.add_argument("model")
    sweep.add_argument("--protocol", choices=["http", "grpc"], default="grpc")
    sweep.add_argument("--url", help="server address (default: 127.0.0.1:8001 gRPC, :8000 HTTP)")
    sweep.add_argument(
        "--concurrency",
        default="1:32:x2",
        help="closed-loop levels: START:STOP:xFACTOR, START:STOP:+STEP or 1,4,8 (default: %(default)s)",
    )
    sweep.add_argument(
        "--request-rate",
        metavar="R1,R2,...",
        help="open-loop mode: requests per second per level, instead of concurrency",
    )
    sweep.add_argument("--batch", type=int, default=1, help="rows per request (default: %(default)s)")
    sweep.add_argument(
        "--duration", "--duration-s", dest="duration_s", type=duration, default=10.0,
        help="one measurement window, e.g. 10s (default: %(default)s s)",
    )  # fmt: skip
    sweep.add_argument(
        "--warmup", "--warmup-s", dest="warmup_s", type=duration, default=2.0,
        help="before each level, e.g. 2s (default: %(default)s s)",
    )  # fmt: skip
    sweep.add_argument(
        "--max-windows",
        type=int,
        default=5,
        help="windows per level until two agree within 10%% (default: %(default)s)",
    )
    sweep.add_argument("--input-data", metavar="FILE", help=".npz or .json inputs instead of random ones")
    sweep.add_argument(
        "--shared-memory",
        action="store_true",
        help="send inputs and receive outputs through system shared memory",
    )
    sweep.add_argument("--out", metavar="results.csv", help="write CSV, and JSON and PNG beside it")
    sweep.set_defaults(run=_sweep)


def _load(args: argparse.Namespace) -> int:
    from tidepool.clients.locust_run import LoadSettings, run_load

    summary = run_load(
        LoadSettings(
            model=args.model,
            users=args.users,
            spawn_rate=args.spawn_rate,
            duration=f"{max(1, round(args.duration))}s",
            protocol=args.protocol,
            url=args.url,
            p99_ms=args.p99_ms,
            workers=args.workers,
            report_dir=Path(args.report_dir) if args.report_dir else None,
            batch=args.batch,
            input_data=args.input_data,
            step_users=args.step_users,
            step_seconds=args.step_seconds,
            request_log=args.request_log,
        )
    )
    print(
        f"\n{args.model} over {args.protocol}: {summary.requests} requests answered, "
        f"{summary.failures} failed, "
        f"{summary.requests_per_s:.1f} req/s, p50 {summary.p50_ms:.0f} ms, p99 {summary.p99_ms:.0f} ms"
    )
    if summary.by_worker:
        print("requests per worker: " + ", ".join(f"{k[:12]} {v}" for k, v in summary.by_worker.items()))
    print(f"reports: {summary.report_dir}/report.html and {summary.report_dir}/locust_*.csv")
    problems = summary.verdict(args.p99_ms)
    for problem in problems:
        print(f"tidepool load: FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _add_load(commands: Any) -> None:
    load = commands.add_parser("load", help="a headless Locust load test with CSV and HTML reports")
    load.add_argument("model")
    load.add_argument("--users", type=int, default=32)
    load.add_argument("--spawn-rate", type=float, default=8.0, help="users started per second")
    load.add_argument("--duration", type=duration, default=60.0, help="e.g. 60s, 5m (default: 60s)")
    load.add_argument("--protocol", choices=["http", "grpc"], default="grpc")
    load.add_argument("--url", help="server address (default: 127.0.0.1:8001 gRPC, :8000 HTTP)")
    load.add_argument("--p99-ms", type=float, help="fail when p99 latency is above this bound")
    load.add_argument(
        "--workers", type=int, default=0, help="run Locust distributed: one master and N worker processes"
    )
    load.add_argument("--report-dir", help="default: a new timestamped folder under ./reports/")
    load.add_argument("--batch", type=int, default=1, help="rows per request")
    load.add_argument("--input-data", metavar="FILE", help=".npz or .json inputs instead of random ones")
    load.add_argument(
        "--step-users",
        metavar="N|U1,U2,...",
        help="step load: N adds N users every --step-seconds (4 steps); a list gives the users of each step",
    )
    load.add_argument(
        "--step-seconds", "--step", dest="step_seconds", type=duration, default=10.0,
        help="length of one step, e.g. 10s (default: %(default)s s)",
    )  # fmt: skip
    load.add_argument(
        "--request-log",
        action="store_true",
        help="also keep every request (finished at, response time, ok) in requests-<pid>.csv",
    )
    load.set_defaults(run=_load)


def _profile(args: argparse.Namespace) -> int:
    from tidepool.planning.report import format_report, write_report

    model_dir = Path(args.model_dir)
    trace = Path(args.trace) if args.trace else None
    profile = _measuring(args).profile(
        model_dir, args.precision, args.threads, args.graph, trace=trace, progress=progress_printer
    )
    print(file=sys.stderr)
    graph = "" if args.graph == "eager" else f"-{args.graph}"
    out = Path(args.out or f"profiles/{model_dir.name}-{args.device}-{args.precision}{graph}.json")
    written = write_report(profile, out)
    print(format_report(profile))
    print("wrote " + ", ".join(str(p) for p in written) + (f", {args.trace}" if args.trace else ""))
    return 0


def _add_profile(commands: Any) -> None:
    profile = commands.add_parser("profile", help="measure memory and latency per batch size")
    profile.add_argument("model_dir", help="a model directory (with config.pbtxt)")
    _add_measuring_options(profile)
    profile.add_argument(
        "--out",
        help="profile JSON (default: profiles/MODEL-DEVICE-PRECISION.json, -frozen added for --graph "
        "frozen); "
        "report and plots are written beside it",
    )
    profile.add_argument("--trace", metavar="FILE", help="also write a Chrome trace of one batch")
    profile.add_argument("--precision", choices=["fp32", "bf16", "fp16", "int8"], default="fp32")
    profile.add_argument(
        "--graph",
        choices=["eager", "frozen"],
        default="eager",
        help="run the module as loaded, or traced and frozen (the GRAPH parameter; default: eager)",
    )
    profile.add_argument(
        "--threads", type=int, help="torch threads (default: the config's TORCH_NUM_THREADS)"
    )
    profile.set_defaults(run=_profile)


def _plan(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from tidepool.planning.plan import Budgets
    from tidepool.planning.run import (
        PlanSettings,
        gather_profiles,
        node_shares,
        plan_model,
        repository_models,
        saved_profile_paths,
    )

    began = time.perf_counter()
    models = repository_models(Path(args.model_dir))
    memory, budget_text = _memory_budget(args.memory_budget, args.device)
    settings = PlanSettings(
        model_dir=models[0],
        budgets=Budgets(
            memory_bytes=memory,
            latency_ms=args.latency_budget_ms,
            headroom=args.headroom,
            cores=args.cores or usable_cores(),
            bounded_queue=args.bounded_queue,
            max_output_error=args.max_output_error,
            elastic_threads=args.elastic_threads,
        ),
        measuring=_measuring(args),
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
        shares = node_shares(models, memory, budget_text)
        impossible = []
        for model in models:
            share = shares[model]
            print(f"== {model.name}: {share.share_bytes / 2**20:.0f} MiB of the node budget {budget_text}")
            saved = saved_profile_paths(model)
            if saved:
                print(f"planning from the {len(saved)} profiles `tidepool plan --write` saved beside it")
            one = replace(
                settings,
                model_dir=model,
                saved_profiles=saved,
                budgets=replace(settings.budgets, memory_bytes=share.share_bytes),
                node_share=share,
                report_dir=settings.report_dir / model.name if settings.report_dir else None,
            )
            outcome = plan_model(one, gather_profiles(one, say=print, progress=progress_printer), say=print,
                                 progress=progress_printer, began=began)  # fmt: skip
            if outcome.chosen is None:
                impossible.append(f"{model.name}: {outcome.impossible}")
        for reason in impossible:
            print(f"tidepool plan: impossible: {reason}", file=sys.stderr)
        return 2 if impossible else 0
    if args.from_server:
        from tidepool.planning.live import LiveSettings, replan_from_server

        live = LiveSettings(
            args.from_server, args.model or settings.model_dir.name, args.window, args.apply, args.watch
        )
        if not settings.saved_profiles:
            settings = _profiles_for_live(settings, live)
        profiles = gather_profiles(settings, say=print, progress=progress_printer)
        return replan_from_server(settings, live, profiles, say=lambda text: print(text, flush=True))
    profiles = gather_profiles(settings, say=print, progress=progress_printer)
    outcome = plan_model(settings, profiles, say=print, progress=progress_printer, began=began)
    if outcome.chosen is None:
        print(f"tidepool plan: impossible: {outcome.impossible}. Nothing was written.", file=sys.stderr)
        return 2
    return 0


def _memory_budget(text: str, device: str) -> tuple[int, str]:
    """--memory-budget as a size ('2GiB') or per tier as the node budget is written
    ('host=2GiB,cuda:0=10GiB'): the bytes of the tier the model runs on, and how to say it."""
    from tidepool.pool.budget import format_budget, parse_budget

    budget = parse_budget(text, "--memory-budget")
    tier = "host" if device == "cpu" else "cuda:0"
    if tier not in budget:
        raise TidepoolError(
            f"--memory-budget {text!r} names no {tier} budget, the tier --device {device} plans for"
        )
    return budget[tier], format_budget({tier: budget[tier]})


def _profiles_for_live(settings: PlanSettings, live: LiveSettings) -> PlanSettings:
    """A re-plan of a live server plans from the profiles `tidepool plan --write` saved beside the
    config; only where there are none it profiles here, saying so, and warns when the server is busy."""
    from dataclasses import replace

    from tidepool.planning.live import serving_rate
    from tidepool.planning.run import PROFILES_DIRECTORY, saved_profile_paths

    saved = saved_profile_paths(settings.model_dir)
    if saved:
        print(f"planning from the {len(saved)} profiles `tidepool plan --write` saved in "
              f"{settings.model_dir / PROFILES_DIRECTORY}", flush=True)  # fmt: skip
        return replace(settings, saved_profiles=saved)
    print(f"no saved profiles in {settings.model_dir / PROFILES_DIRECTORY} and no --profile: profiling "
          "now, on this machine", file=sys.stderr)  # fmt: skip
    rate = serving_rate(live.server, live.model)
    if rate > 0:
        print(f"warning: the server answers {rate:.0f} samples/s of {live.model} now; a profile taken "
              "beside it measures that load too (plan once on an idle machine with --write, which "
              "saves the profiles)", file=sys.stderr)  # fmt: skip
    return settings


def _add_plan(commands: Any) -> None:
    from tidepool.planning.plan import VERIFY_LEVELS, VERIFY_WINDOW_S

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
    plan.add_argument(
        "--max-output-error",
        type=float,
        default=0.0,
        help="largest max-abs difference from fp32 outputs a lower precision may have (default 0: fp32 only)",
    )
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
    plan.add_argument("--write", action="store_true", help="write config.pbtxt (default: print only)")
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
    _add_measuring_options(plan)
    plan.set_defaults(run=_plan)


def _status(args: argparse.Namespace) -> int:
    from tidepool.pool.ledger import ledger_paths
    from tidepool.pool.status import describe_ledgers

    for line in describe_ledgers(ledger_paths(server_pid=args.server_pid)):
        print(line)
    return 0


def _add_status(commands: Any) -> None:
    status = commands.add_parser(
        "status",
        help="the node memory budget: what each model's pool holds, read from the servers' shared ledgers",
        description="Print each running server's node ledger per tier (budget, reserved, trims, "
        "denials) and a line per pool: model, instance, pid, floor, reserved, in use. Reads the "
        "shared files directly: no server call.",
    )
    status.add_argument("--server-pid", type=int, help="only this tritonserver's ledgers")
    status.set_defaults(run=_status)


def _deploy_manifests(args: argparse.Namespace) -> int:
    from tidepool.deploy.manifests import DeploySettings, write_manifests
    from tidepool.deploy.sizing import pod_needs

    settings = DeploySettings(
        name=args.name,
        image=args.image,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        target_ratio=args.target_ratio,
        namespace=args.namespace,
    )
    needs = pod_needs(Path(args.model_repository))
    for line in needs.describe():
        print(line)
    for path in write_manifests(needs, Path(args.out), settings):
        print(f"wrote {path}")
    return 0


def _add_deploy_manifests(commands: Any) -> None:
    from tidepool.deploy.manifests import DeploySettings

    defaults = DeploySettings()
    deploy = commands.add_parser(
        "deploy-manifests",
        help="render Kubernetes manifests whose resources follow the repository's planned configs",
        description="Write a Deployment (probes, /dev/shm, CPU, memory and GPU from the plans), a "
        "Service, a PodDisruptionBudget, a PodMonitor, an autoscaling/v2 HPA on the queue-to-compute "
        "ratio and the prometheus-adapter rule that serves it (docs/deploy.md).",
    )
    deploy.add_argument("model_repository", metavar="MODEL_REPOSITORY", help="a planned model repository")
    deploy.add_argument("--out", default="deploy/kubernetes", metavar="DIR", help="default: %(default)s")
    deploy.add_argument("--name", default=defaults.name, help="objects' name (default: %(default)s)")
    deploy.add_argument(
        "--image",
        default=defaults.image,
        help="built from deploy/Dockerfile (default: %(default)s)",
    )
    deploy.add_argument("--namespace", default=None, help="default: none (kubectl's current namespace)")
    deploy.add_argument(
        "--min-replicas", type=int, default=defaults.min_replicas, help="default: %(default)s"
    )
    deploy.add_argument(
        "--max-replicas", type=int, default=defaults.max_replicas, help="default: %(default)s"
    )
    deploy.add_argument(
        "--target-ratio",
        type=float,
        default=defaults.target_ratio,
        help="queue time over compute time per pod above which the HPA adds replicas (default: %(default)s)",
    )
    deploy.set_defaults(run=_deploy_manifests)


COMMANDS = (
    _add_serve, _add_install_backend, _add_infer, _add_sweep, _add_load, _add_profile, _add_plan,
    _add_status, _add_deploy_manifests,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidepool",
        description="Serve PyTorch models on Triton through a reusable memory pool, and measure them.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except TidepoolError as exc:
        print(f"tidepool {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a server that cannot be reached, or a bug: still one line
        from tritonclient.utils import InferenceServerException

        if isinstance(exc, (OSError, InferenceServerException)):
            print(f"tidepool {args.command}: error: {exc}", file=sys.stderr)
            return 1
        if isinstance(exc, http.client.HTTPException):  # e.g. an HTTP client sent to a gRPC port
            print(
                f"tidepool {args.command}: error: the server did not answer in HTTP ({exc}); "
                "is that its gRPC port? (--protocol grpc speaks gRPC)",
                file=sys.stderr,
            )
            return 1
        if os.environ.get("TIDEPOOL_DEBUG"):
            raise
        print(
            f"tidepool {args.command}: unexpected error: {type(exc).__name__}: {exc} "
            "(a bug in Tidepool; TIDEPOOL_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
