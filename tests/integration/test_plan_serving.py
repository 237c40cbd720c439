"""Profile a model, plan its config, and serve it on a real server: as written, and after the
edits a person or a tool like Model Analyzer makes (max_batch_size, instance count, delay)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np

from tidepool.clients.connection import Connection
from tidepool.configfile import as_dict, copy_model, read_config, set_instances
from tidepool.launcher.server import ServerConfig, TritonServer
from tidepool.planning.candidates import plan
from tidepool.planning.config_writer import write_plan
from tidepool.planning.live import served_label
from tidepool.planning.plan import Budgets
from tidepool.planning.profile import Profile
from tidepool.planning.profiler import profile_model
from tidepool.planning.run import PROFILES_DIRECTORY, PROFILES_NOTE
from tidepool.testing import MODEL_REPOSITORY

PROFILES = Path(__file__).parents[1] / "unit" / "profiles"
EDITS = {
    **{f"encoder_mbs{size}": {"max_batch_size": size} for size in (1, 2, 4, 16, 32, 128)},
    "encoder_two": {"instances": 2},
    "encoder_nodelay": {"delay_us": 0},
    "encoder_longdelay": {"delay_us": 100_000},
}


def edited_copy(model_dir, repository, name: str, max_batch_size=None, instances=None, delay_us=None) -> None:
    config = read_config(model_dir / "config.pbtxt")
    if max_batch_size is not None:
        config.max_batch_size = max_batch_size
        # Triton refuses a preferred size above max_batch_size: whoever lowers it drops those too.
        kept = [size for size in config.dynamic_batching.preferred_batch_size if size <= max_batch_size]
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(kept)
    if instances is not None:
        set_instances(config, instances)  # as Model Analyzer writes it: one group of that count
    if delay_us is not None:
        config.dynamic_batching.max_queue_delay_microseconds = delay_us
    copy_model(model_dir, repository / name, config)


def test_a_planned_config_serves_as_written_and_after_model_analyzer_style_edits(tmp_path):
    repository = tmp_path / "repository"
    model_dir = repository / "encoder"
    copy_model(MODEL_REPOSITORY / "encoder", model_dir)
    profile = profile_model(model_dir, (1, 2, 4), max_seconds_per_point=0.5, min_iterations=3)
    assert [p.batch for p in profile.points] == [1, 2, 4]
    assert all(abs(p.fit_error) <= 0.10 for p in profile.points)
    budgets = Budgets(memory_bytes=512 * 2**20, latency_ms=2000, cores=2)
    result = plan(profile, budgets)
    write_plan(model_dir, budgets, result)
    written = read_config(model_dir / "config.pbtxt")
    assert written.max_batch_size == result.max_batch_size == 4
    assert "POOL_WARMUP_BATCH_SIZES" not in written.parameters  # warm-up follows max_batch_size
    for name, edit in EDITS.items():
        edited_copy(model_dir, repository, name, **edit)

    with TritonServer(ServerConfig.on_free_ports(repository)) as server:
        states = server.model_states()
        with Connection.open("grpc", server.config.grpc_url) as grpc:
            for name in ["encoder", *EDITS]:
                spec = grpc.model_spec(name)
                rows = min(spec.max_batch_size, 3)
                ids = np.arange(rows * 128, dtype=np.int32).reshape(rows, 128) % 1000
                assert grpc.infer(name, {"INPUT_IDS": ids}, spec)["EMBEDDING"].shape == (rows, 256), name
    assert states == dict.fromkeys(["encoder", *EDITS], "READY")


def test_plan_verify_serves_each_candidate_at_each_level_and_writes_the_chosen_one(tmp_path):
    """`tidepool plan --verify` end to end from two saved profiles: three candidates (1x2, the
    elastic 2x1-2, and 2x1-2 with each instance's batch capped at half), each loaded on a real server
    and measured at each level; the table, CSV and PNG are written, and config.pbtxt carries the
    chosen candidate with what verification measured."""
    model_dir = tmp_path / "encoder"
    copy_model(MODEL_REPOSITORY / "encoder", model_dir)
    recorded = Profile.from_json((PROFILES / "encoder_cpu.json").read_text())
    one_thread = Profile.from_json(recorded.to_json())
    one_thread.torch_threads = 1
    for point in one_thread.points:  # one thread runs a lone request slower: the elastic plan ranks first
        point.latency_p50_ms /= 0.7
        point.latency_p99_ms /= 0.7
        point.throughput *= 0.7
    paths = []
    for profile in (recorded, one_thread):
        paths += ["--profile", str(tmp_path / f"p{profile.torch_threads}.json")]
        Path(paths[-1]).write_text(profile.to_json())
    done = subprocess.run(
        [sys.executable, "-m", "tidepool.cli", "plan", str(model_dir), *paths, "--cores", "2",
         "--memory-budget", "1GiB", "--latency-budget-ms", "200", "--verify", "--levels", "1,2",
         "--window-s", "1", "--write", "--report-dir", str(tmp_path / "report")],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with (tmp_path / "report" / "verification.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    labels = {row["candidate"] for row in rows}
    assert sorted(label.split()[0] for label in labels) == ["1x2", "2x1-2", "2x1-2"]
    shared, full = sorted(int(label.split()[2][1:]) for label in labels if label.startswith("2x1-2"))
    assert shared == full // 2
    assert {row["concurrency"] for row in rows} == {"1", "2"} and len(rows) == 6
    assert all(float(row["throughput"]) > 0 and row["errors"] == "0" for row in rows)
    assert (tmp_path / "report" / "verification.png").stat().st_size > 0
    [line] = [line for line in done.stdout.splitlines() if line.endswith("<- chosen")]
    [chosen] = [label for label in labels if line.startswith(label)]
    assert served_label(as_dict(read_config(model_dir / "config.pbtxt")), cores=2) == chosen
    assert "Verified on a real server" in (model_dir / "config.pbtxt").read_text()
    # --write keeps the profiles it planned from beside the config, and the header says where.
    saved = sorted(p.name for p in (model_dir / PROFILES_DIRECTORY).glob("*.json"))
    assert saved == ["cpu-fp32-eager-1t.json", "cpu-fp32-eager-2t.json"], saved
    assert PROFILES_NOTE in (model_dir / "config.pbtxt").read_text()
