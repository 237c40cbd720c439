"""How a sweep's levels are shown: a table on the terminal, and CSV, JSON and a PNG plot of
throughput against p99."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

from tidepool.clients.sweep import LevelResult
from tidepool.extras import pyplot

# (field, header, width, format) of the printed table
COLUMNS = [
    ("level", "level", 7, "g"),
    ("throughput", "infer/s", 10, ".1f"),
    ("p50_ms", "p50 ms", 8, ".1f"),
    ("p90_ms", "p90 ms", 8, ".1f"),
    ("p95_ms", "p95 ms", 8, ".1f"),
    ("p99_ms", "p99 ms", 8, ".1f"),
    ("errors", "errors", 7, "d"),
    ("avg_batch", "batch", 7, ".2f"),
    ("queue_us", "queue us", 10, ".0f"),
    ("compute_infer_us", "infer us", 10, ".0f"),
    ("stable", "stable", 8, ""),
]


# Beside those, for a model with sequence inputs.
LENGTH_COLUMNS = [
    ("tokens_per_s", "tokens/s", 10, ".0f"),
    ("p99_short_ms", "p99 short", 10, ".1f"),
    ("p99_long_ms", "p99 long", 10, ".1f"),
    ("padding", "padding", 9, ".1%"),
]


def format_table(results: list[LevelResult]) -> str:
    """The levels as a table; with tokens/s, short and long p99 and padding where tokens were sent."""
    columns = COLUMNS + (LENGTH_COLUMNS if any(r.tokens_per_s for r in results) else [])
    lines = ["".join(f"{header:>{width}}" for _, header, width, _ in columns)]
    for result in results:
        values = asdict(result)
        lines.append("".join(f"{format(values[name], fmt):>{width}}" for name, _, width, fmt in columns))
    return "\n".join(lines)


def write_reports(results: list[LevelResult], out: Path, title: str) -> list[Path]:
    """CSV at `out`, JSON and a PNG plot (throughput vs p99) beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) for r in results]
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    json_path = out.with_suffix(".json")
    json_path.write_text(json.dumps(rows, indent=2))
    png_path = out.with_suffix(".png")
    plt = pyplot()

    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot([r.p99_ms for r in results], [r.throughput for r in results], marker="o")
    for r in results:
        axes.annotate(f"{r.mode[0]}={r.level:g}", (r.p99_ms, r.throughput), fontsize=8)
    axes.set_xlabel("p99 latency (ms)")
    axes.set_ylabel("throughput (inferences/s)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return [out, json_path, png_path]
