"""A model's profile: memory and latency per batch size, the fit memory(b) = static +
per_sample * b + workspace, and its JSON form. Needs numpy only, so that planning from a saved
profile never imports torch."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tidepool.errors import TidepoolError

# What `tidepool profile` measures unless told otherwise: these batch sizes, each for about this long.
PROFILE_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
SECONDS_PER_POINT = 1.0


class ProfileFileError(TidepoolError):
    """A profile file that cannot be read back."""


def max_abs_difference(output_difference: dict[str, float]) -> float:
    """The largest absolute difference from fp32 over a model's outputs (0 when none was measured)."""
    return max((v for k, v in output_difference.items() if k.endswith("_max_abs")), default=0.0)


@dataclass
class BatchPoint:
    batch: int
    io_bytes: int  # the execution's pool blocks: gathered inputs and outputs
    tensor_bytes: int  # peak of torch's own tensors during the forward pass
    latency_p50_ms: float
    latency_p99_ms: float
    throughput: float  # samples per second
    predicted_bytes: int = 0  # from the fit, static included
    fit_error: float = 0.0  # (predicted - measured) / measured, static included
    length: int = 0  # the sequence length of every row (a length profile's point; 0: as planned)

    @property
    def dynamic_bytes(self) -> int:
        return self.io_bytes + self.tensor_bytes


@dataclass
class Profile:
    model: str
    device: str
    precision: str
    torch_threads: int
    static_bytes: int  # parameters and buffers
    points: list[BatchPoint]
    per_sample_bytes: float = 0.0
    workspace_bytes: float = 0.0
    stopped_because: str = "every batch size asked for was measured"
    output_difference: dict[str, float] = field(default_factory=dict)  # against fp32
    seconds: float = 0.0
    machine: str = ""  # where it was measured (tidepool.machine.describe_machine)
    graph: str = "eager"  # or "frozen" (runtime/graph.py)
    graph_reason: str = ""  # why `tidepool plan` profiled that graph
    input_shapes: dict[str, list[int]] = field(default_factory=dict)  # one row of each input measured
    inputs_from: str = "generated"  # or "samples" (an --inputs file)
    # A model with sequence inputs planned for a length mix: points over rows x length (lengths.py),
    # and why requests of different lengths cannot share a pass where they cannot ("" where they can).
    length_points: list[BatchPoint] = field(default_factory=list)
    unpadded_because: str = ""

    def predict_bytes(self, batch: int) -> int:
        return int(self.static_bytes + self.per_sample_bytes * batch + self.workspace_bytes)

    def point(self, batch: int) -> BatchPoint | None:
        return next((p for p in self.points if p.batch == batch), None)

    def fit(self) -> None:
        """Least squares on dynamic bytes = per_sample * b + workspace (workspace >= 0)."""
        batches = np.array([p.batch for p in self.points], dtype=float)
        dynamic = np.array([p.dynamic_bytes for p in self.points], dtype=float)
        if len(batches) >= 2:
            slope, intercept = np.polyfit(batches, dynamic, 1)
        else:
            slope, intercept = dynamic[0] / batches[0], 0.0
        if intercept < 0:
            slope, intercept = float((batches @ dynamic) / (batches @ batches)), 0.0
        self.per_sample_bytes, self.workspace_bytes = float(slope), float(intercept)
        for p in self.points:
            p.predicted_bytes = self.predict_bytes(p.batch)
            measured = self.static_bytes + p.dynamic_bytes
            p.fit_error = (p.predicted_bytes - measured) / measured

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        data = json.loads(text)
        data["points"] = [BatchPoint(**p) for p in data["points"]]
        data["length_points"] = [BatchPoint(**p) for p in data.get("length_points", [])]
        return cls(**data)

    @classmethod
    def read(cls, path: Path | str) -> Profile:
        try:
            return cls.from_json(Path(path).read_text())
        except OSError as exc:
            raise ProfileFileError(f"{path}: cannot read the profile: {exc.strerror}") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise ProfileFileError(f"{path}: not a profile written by `tidepool profile` ({exc})") from None
