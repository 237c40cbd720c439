"""What one reload costs the requests served meanwhile, with the new instances loading at a lower
priority (TIDEPOOL_LOADING_NICENESS=10) and at full priority (0, the default), on one machine:

per round and niceness, a fresh server (explicit model control) serving the model with 2
instances x 1 thread; at each concurrency a closed loop for --seconds without a reload, then the
same with a reload (a config override, as `tidepool plan --apply` sends) 2 s in. Printed: requests
served with the reload / without, p99 with it, and how long the reload took; median (min-max) over
--rounds rounds, the two niceness values alternated.

    .venv/bin/python -m benchmarks.reload_under_load [--model encoder] [--levels 1,4] [--seconds 12]
        [--rounds 2] [--niceness 10,0]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.in_turn import spread
from tidepool.clients.closed_loop import LoadResult, run_closed_loop
from tidepool.clients.connection import Connection
from tidepool.configfile import as_dict, copy_model, read_config
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.runtime.cores import NICENESS_VARIABLE
from tidepool.spec import positive_ints
from tidepool.testing import MODEL_REPOSITORY

RELOAD_AFTER_S = 2.0


def two_by_one(model_dir: Path) -> dict:
    config = as_dict(read_config(model_dir / "config.pbtxt"))
    config["instance_group"] = [{"count": 2, "kind": "KIND_CPU"}]
    config["parameters"]["TORCH_NUM_THREADS"] = {"string_value": "1"}
    return config


def with_reload(server: TritonServer, model: str, config: dict, level: int, seconds: float, generation: int):
    """A closed loop with one reload RELOAD_AFTER_S in; (load result, seconds the reload took)."""
    took: list[float] = []

    def reload() -> None:
        time.sleep(RELOAD_AFTER_S)
        override = json.loads(json.dumps(config))
        override["parameters"]["TIDEPOOL_PLAN_GENERATION"] = {"string_value": str(generation)}
        with Connection.open("http", server.config.http_url) as http:
            began = time.perf_counter()
            http.client.load_model(model, config=json.dumps(override))
            took.append(time.perf_counter() - began)

    reloader = threading.Thread(target=reload)
    reloader.start()
    result = run_closed_loop(model, server.config.grpc_url, concurrency=level, duration_s=seconds)
    reloader.join()
    return result, took[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--levels", default="1,4")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--niceness", default="10,0", help="TIDEPOOL_LOADING_NICENESS values, alternated")
    args = parser.parse_args()
    levels = positive_ints(args.levels, "--levels")
    # (niceness, level) -> [(served with reload / without, p99 with reload ms, reload s)]
    figures: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        model_dir = repository / args.model
        copy_model(MODEL_REPOSITORY / args.model, model_dir)
        config = two_by_one(model_dir)
        for round_number in range(args.rounds):
            for niceness in [int(n) for n in args.niceness.split(",")]:
                os.environ[NICENESS_VARIABLE] = str(niceness)
                server_config = ServerConfig.on_free_ports(repository, model_control="explicit")
                with (
                    TritonServer(server_config) as server,
                    Connection.open("http", server_config.http_url) as http,
                ):
                    http.client.load_model(args.model, config=json.dumps(config))
                    for index, level in enumerate(levels):
                        steady: LoadResult = run_closed_loop(
                            args.model, server_config.grpc_url, concurrency=level, duration_s=args.seconds
                        )
                        reloaded, took = with_reload(
                            server, args.model, config, level, args.seconds, index + 1
                        )
                        ratio = len(reloaded.latencies_ms) / max(1, len(steady.latencies_ms))
                        figures.setdefault((niceness, level), []).append(
                            (ratio, reloaded.percentile_ms(99), took)
                        )
                        print(
                            f"round {round_number + 1} niceness {niceness} c={level}: "
                            f"{steady.requests_per_s:.1f}/s steady (p99 {steady.percentile_ms(99):.0f} ms), "
                            f"{reloaded.requests_per_s:.1f}/s with a reload (p99 "
                            f"{reloaded.percentile_ms(99):.0f} ms, {len(reloaded.errors)} errors); "
                            f"the reload took {took:.1f} s",
                            flush=True,
                        )

    print(f"\n{args.model}, 2x1, one reload {RELOAD_AFTER_S:.0f} s into {args.seconds:.0f} s of closed loop; "
          f"median (min-max) of {args.rounds} rounds")  # fmt: skip
    print(f"{'niceness':>9}{'c':>4}{'served with / without reload':>32}{'p99 with reload ms':>24}"
          f"{'reload s':>20}")  # fmt: skip
    for (niceness, level), rows in sorted(figures.items()):
        ratios, p99s, took = zip(*rows, strict=True)
        print(f"{niceness:>9}{level:>4}{spread(list(ratios), 2):>32}{spread(list(p99s), 0):>24}"
              f"{spread(list(took), 1):>20}")  # fmt: skip


if __name__ == "__main__":
    main()
