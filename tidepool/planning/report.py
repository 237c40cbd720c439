"""A profile written out for people: the JSON, a Markdown table and three plots (memory, latency,
throughput against batch size)."""

from __future__ import annotations

import math
from pathlib import Path

from tidepool.extras import pyplot
from tidepool.planning.profile import Profile


def write_report(profile: Profile, out_json: Path) -> list[Path]:
    """profile.json, a Markdown report and three plots beside it."""
    plt = pyplot()

    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(profile.to_json())
    stem = out_json.with_suffix("")
    batches = [p.batch for p in profile.points]
    plots = {
        "memory": ("memory (MiB)", [(profile.static_bytes + p.dynamic_bytes) / 2**20 for p in profile.points],
                   [p.predicted_bytes / 2**20 for p in profile.points]),
        "latency": ("latency p50 / p99 (ms)", [p.latency_p50_ms for p in profile.points],
                    [p.latency_p99_ms for p in profile.points]),
        "throughput": ("throughput (samples/s)", [p.throughput for p in profile.points], None),
    }  # fmt: skip
    written = [out_json]
    for name, (label, first, second) in plots.items():
        figure, axes = plt.subplots(figsize=(5, 3.5))
        axes.plot(batches, first, marker="o", label="measured" if name == "memory" else "p50")
        if second is not None:
            axes.plot(batches, second, marker="x", linestyle="--", label="fit" if name == "memory" else "p99")
            axes.legend()
        axes.set_xscale("log", base=2)
        axes.set_xlabel("batch size")
        axes.set_ylabel(label)
        axes.set_title(f"{profile.model} ({profile.device}, {profile.precision}, {profile.graph} graph)")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        path = Path(f"{stem}_{name}.png")
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    report = Path(f"{stem}.md")
    report.write_text(format_report(profile))
    written.append(report)
    return written


def format_report(profile: Profile) -> str:
    mib = 2**20
    lines = [
        f"# Profile of {profile.model} ({profile.device}, {profile.precision}, {profile.graph} graph, "
        f"{profile.torch_threads} torch threads)",
        "",
        f"static (weights and buffers): {profile.static_bytes / mib:.2f} MiB; fit: memory(b) = static + "
        f"{profile.per_sample_bytes / mib:.3f} MiB x b + {profile.workspace_bytes / mib:.3f} MiB",
        f"stopped: {profile.stopped_because}; took {profile.seconds:.1f} s",
        "",
        "| batch | dynamic MiB | measured MiB | predicted MiB | error | p50 ms | p99 ms | samples/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in profile.points:
        measured = (profile.static_bytes + p.dynamic_bytes) / mib
        lines.append(
            f"| {p.batch} | {p.dynamic_bytes / mib:.2f} | {measured:.2f} | {p.predicted_bytes / mib:.2f} | "
            f"{p.fit_error:+.1%} | {p.latency_p50_ms:.1f} | {p.latency_p99_ms:.1f} | {p.throughput:.0f} |"
        )
    if profile.output_difference:
        lines += ["", "output difference against fp32: "
                  + ", ".join(f"{k} {v:.3g}" for k, v in profile.output_difference.items())]  # fmt: skip
    worst = max((abs(p.fit_error) for p in profile.points), default=math.nan)
    lines += ["", f"largest fit error: {worst:.1%}", *length_table(profile)]
    return "\n".join(lines) + "\n"


def length_table(profile: Profile) -> list[str]:
    """The points over rows x length, beside the fit that plans for a length mix (planning/lengths.py)."""
    if not profile.length_points:
        return []
    from tidepool.planning.lengths import LengthFit

    fit = LengthFit.of(profile.length_points)
    lines = [
        "",
        f"## Over rows x length: latency(rows, L) = {fit.fixed_ms:.3f} ms + {fit.per_token_ms * 1e3:.2f} us "
        f"x tokens + {fit.per_token_length_ms * 1e6:.3f} ns x tokens x L (largest error {fit.error:.1%})",
        "",
        "| rows | length | tokens | p50 ms | fit ms | p99 ms | pool KiB | torch MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in profile.length_points:
        lines.append(
            f"| {p.batch} | {p.length} | {p.batch * p.length} | {p.latency_p50_ms:.2f} | "
            f"{fit.pass_ms(p.batch, p.length):.2f} | {p.latency_p99_ms:.2f} | {p.io_bytes / 1024:.1f} | "
            f"{p.tensor_bytes / 2**20:.2f} |"
        )
    if profile.unpadded_because:
        lines += ["", f"requests of different lengths cannot share a pass: {profile.unpadded_because}"]
    return lines
