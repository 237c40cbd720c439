"""The line an instance's log says at load: where it runs, its pool, the process's settings, its
elastic threads, and every note of how its config was taken (adjusted values, the graph, warm-up,
the node budget, how requests of different lengths share passes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidepool.runtime.instance import ModelInstance


def log_line(instance: ModelInstance) -> str:
    s, pool, share = instance.settings, instance.pool, instance.core_share
    pool_text = f"pool {pool.kind} ({pool.kind_reason})" if pool else "pool off (POOL=off)"
    notes = [*s.notes, *instance.process_notes, *instance.graph_notes, *instance.warmup_notes,
             *instance.budget_notes, *(instance.lengths.describe() if instance.lengths else [])]  # fmt: skip
    if s.plan_generation:
        notes.append(f"config generation {s.plan_generation}: {s.plan_reason}")
    threads = (
        f"; elastic threads: up to {share.cap}, {share.cores} cores shared with the server's other "
        f"busy instances ({share.path})"
        if share
        else ""
    )
    outputs = f", outputs to the {s.gpu_outputs}" if instance.link is not None else ""
    return (
        f"{s.device}{outputs}, {s.precision}, {s.graph} graph; {pool_text}; {instance.process.describe()}"
        + threads
        + ("; attention fast path off in its passes" if s.attention_fast_path_off else "")
        + "".join(f"; NOTE: {note}" for note in notes)
    )
