import csv
import json

import pytest

from tidepool.clients.sweep import LevelResult, ServerSplit, SweepError, parse_levels, rotated
from tidepool.clients.sweep_report import format_table, write_reports


@pytest.mark.parametrize(
    ("text", "levels"),
    [("1:32:x2", [1, 2, 4, 8, 16, 32]), ("1:8:+3", [1, 4, 7]), ("2,4,16", [2, 4, 16]), ("4", [4])],
)
def test_levels_are_parsed(text, levels):
    assert parse_levels(text) == levels


@pytest.mark.parametrize("text", ["0:8:x2", "1:8:x1", "a,b", "8:1:x2", ""])
def test_bad_levels_are_named(text):
    with pytest.raises(SweepError, match="levels"):
        parse_levels(text)


def test_the_server_split_is_per_request_between_two_snapshots():
    before = {
        "inference_count": 10,
        "execution_count": 10,
        "inference_stats": {"queue": {"count": 10, "ns": 0}},
    }
    after = {
        "inference_count": "110",
        "execution_count": "35",
        "inference_stats": {
            "queue": {"count": "110", "ns": str(100 * 2_000_000)},
            "compute_infer": {"count": "100", "ns": str(100 * 5_000_000)},
        },
    }
    split = ServerSplit.between(before, after)
    assert split.queue_us == pytest.approx(2000) and split.compute_infer_us == pytest.approx(5000)
    assert split.avg_batch == pytest.approx(4.0) and split.compute_output_us == 0


def result(level: int, throughput: float) -> LevelResult:
    return LevelResult("concurrency", level, throughput, 1, 2, 3, 4, 100, 0, 2, True, 10, 1, 500, 2, 1.5)


def test_reports_are_written_as_csv_json_and_png(tmp_path):
    results = [result(1, 50.0), result(8, 200.0)]
    paths = write_reports(results, tmp_path / "out" / "r.csv", "test")
    assert [p.suffix for p in paths] == [".csv", ".json", ".png"]
    rows = list(csv.DictReader(paths[0].open()))
    assert [float(r["throughput"]) for r in rows] == [50.0, 200.0]
    assert json.loads(paths[1].read_text())[1]["level"] == 8
    assert paths[2].read_bytes()[:4] == b"\x89PNG"
    table = format_table(results).splitlines()
    assert "infer/s" in table[0] and "200.0" in table[2]


def test_transient_errors_are_told_apart_from_bad_requests():
    from tritonclient.utils import InferenceServerException

    from tidepool.clients.connection import is_transient

    assert is_transient(ConnectionRefusedError())
    assert is_transient(InferenceServerException("x", status="StatusCode.UNAVAILABLE"))
    assert is_transient(InferenceServerException("Request for unknown model: 'e' has no available versions"))
    assert is_transient(InferenceServerException("busy", status="503"))
    assert not is_transient(InferenceServerException("input IDS: value 500 is outside", status="400"))
    # A request too large for the pool, whatever words it uses, is not retried.
    too_large = "this request does not fit; the pool is unavailable for it"
    assert not is_transient(InferenceServerException(too_large, status="StatusCode.INVALID_ARGUMENT"))


def test_rotated_starts_each_turn_with_the_next_item():
    items = ["a", "b", "c"]
    assert [rotated(items, turn)[0] for turn in range(4)] == ["a", "b", "c", "a"]
    assert rotated(items, 1) == ["b", "c", "a"]
    assert rotated([], 3) == []
