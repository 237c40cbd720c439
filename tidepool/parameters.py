"""Every backend parameter of config.pbtxt in one typed table: its name, its default, how its text
is read (a bad value refused with the parameter's name), how a value is written, and what it
means. The runtime reads through it, the planner writes through it, and the README's parameter
table is made from it (`python -m tidepool.parameters README.md`; tests/unit/test_parameters.py
fails while they differ): a new parameter is one entry here and the code that uses it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from tidepool.spec import ConfigError, LengthMix, parse_bytes, positive_ints

Value = TypeVar("Value")


@dataclass(frozen=True)
class Parameter(Generic[Value]):
    name: str
    default: Value
    parse: Callable[[str, str], Value]  # (text, where) -> value, or ConfigError naming `where`
    meaning: str
    default_text: str = ""  # the default as the README says it, where it is not the value's text
    write_value: Callable[[Value], str] = str

    def read(self, parameters: Mapping[str, str]) -> Value:
        """The value in `parameters` (a config's string parameters), or the default when unset."""
        text = parameters.get(self.name)
        if text is None or not text.strip():
            return self.default
        return self.parse(text.strip(), f"parameter {self.name}")

    def write(self, value: Value) -> str:
        return self.write_value(value)

    @property
    def documented_default(self) -> str:
        """The default as the README's table shows it."""
        if self.default_text:
            return self.default_text
        return "none" if self.default is None else f"`{self.write(self.default)}`"


def one_of(*choices: str) -> Callable[[str, str], str]:
    def parse(text: str, where: str) -> str:
        value = text.lower()
        if value not in choices:
            raise ConfigError(f"{where}: expected one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


def boolean(text: str, where: str) -> bool:
    return one_of("true", "false")(text, where) == "true"


def write_boolean(value: bool) -> str:
    return "true" if value else "false"


def switch(text: str, where: str) -> bool:
    return one_of("on", "off")(text, where) == "on"


def write_switch(value: bool) -> str:
    return "on" if value else "off"


def at_least(minimum: int) -> Callable[[str, str], int]:
    def parse(text: str, where: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{where}: expected an integer, got {text!r}") from None
        if value < minimum:
            raise ConfigError(f"{where}: must be at least {minimum}, got {value}")
        return value

    return parse


def fraction(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{where}: must be between 0 and 1, got {value}")
    return value


def byte_size(text: str, where: str) -> int:
    return parse_bytes(text, where)


def batch_sizes(text: str, where: str) -> tuple[int, ...]:
    return tuple(positive_ints(text, where))


def as_text(text: str, where: str) -> str:
    return text


def sizes_text(value: tuple[int, ...]) -> str:
    return ",".join(map(str, value))


def string_parameters(config: Mapping[str, object]) -> dict[str, str]:
    """name -> text of the parameters of a config as Triton hands it over (JSON-style dict)."""
    given = config.get("parameters") or {}
    assert isinstance(given, Mapping)
    return {name: value.get("string_value", "") for name, value in given.items()}


DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
GRAPHS = ("eager", "frozen")  # see runtime/graph.py
POOL_KINDS = ("auto", "host", "pinned", "cuda")
GPU_OUTPUT_PLACES = ("host", "device")
DEFAULT_HOLD_US = 1000  # see runtime/cores.py
DEFAULT_SPIN_COUNT = 20000  # see runtime/cores.py

MODEL_FACTORY: Parameter[str | None] = Parameter(
    "MODEL_FACTORY", None, as_text,
    "`module:function` returning an `nn.Module`, in the model directory", "one of them",
)  # fmt: skip
TORCHSCRIPT: Parameter[str | None] = Parameter(
    "TORCHSCRIPT", None, as_text, "a TorchScript file in the model directory", "one of them"
)
EXPORTED_PROGRAM: Parameter[str | None] = Parameter(
    "EXPORTED_PROGRAM", None, as_text,
    "a `torch.export` program (`.pt2`) in the model directory, its first dimension dynamic where "
    "`max_batch_size` is over 1", "one of them",
)  # fmt: skip
WEIGHTS: Parameter[str | None] = Parameter(
    "WEIGHTS", None, as_text,
    "weights in the model directory: safetensors (`.safetensors`) or a state dict read with "
    "`weights_only=True`; keys and shapes must match the model",
)  # fmt: skip
TORCH_NUM_THREADS: Parameter[int | None] = Parameter(
    "TORCH_NUM_THREADS", None, at_least(1),
    "torch intra-op threads per instance (the most, with elastic threads)", "the machine's cores",
)  # fmt: skip
ELASTIC_THREADS: Parameter[bool] = Parameter(
    "ELASTIC_THREADS", False, boolean,
    "`true`: CPU instances that together ask for more threads than there are cores share them among "
    "those busy: alone, every core; all busy, an equal share (docs/planning.md)",
    write_value=write_boolean,
)  # fmt: skip
ELASTIC_HOLD_US: Parameter[int] = Parameter(
    "ELASTIC_HOLD_US", DEFAULT_HOLD_US, at_least(0),
    "with elastic threads, while an instance's passes overlap other instances' (load): the least "
    "time it still counts as busy after its forward pass (one taking batches back to back is held "
    "for twice its gap between them); without load it is not held, so a lone request runs on every "
    "core whichever instance takes it",
)  # fmt: skip
ELASTIC_SPIN_COUNT: Parameter[int] = Parameter(
    "ELASTIC_SPIN_COUNT", DEFAULT_SPIN_COUNT, at_least(0),
    "with elastic threads, how long idle OpenMP threads spin before they sleep (libgomp's "
    "`GOMP_SPINCOUNT`; one set in tritonserver's environment wins): long enough to stay awake between "
    "a pass's operators, short enough to leave the cores before another instance takes the next request",
)  # fmt: skip
PRECISION: Parameter[str] = Parameter(
    "PRECISION", "fp32", one_of(*PRECISIONS),
    "`fp32`, `bf16`, `fp16` (GPU), `int8` (CPU, dynamic quantization)",
)  # fmt: skip
GRAPH: Parameter[str] = Parameter(
    "GRAPH", "eager", one_of(*GRAPHS),
    "`eager` runs the module as loaded; `frozen` traces it at load with TorchScript and freezes it "
    "(weights as constants, BatchNorm folded), checked against eager at two batch sizes: a model "
    "whose trace fixed a shape or a branch fails to load with a message (docs/planning.md)",
)  # fmt: skip
DEVICE: Parameter[str] = Parameter(
    "DEVICE", "auto", one_of(*DEVICES),
    "`auto`, `cpu`, `cuda`; `auto` follows the instance group (`KIND_CPU`, `KIND_GPU` and its device)",
)  # fmt: skip
GPU_OUTPUTS: Parameter[str] = Parameter(
    "GPU_OUTPUTS", "host", one_of(*GPU_OUTPUT_PLACES),
    "a GPU instance's outputs: `host` copies them into pinned host memory before `execute` returns "
    "(what HTTP and gRPC clients receive; the stub needs no CUDA memory of its own); `device` hands "
    "them to the stub as device tensors (DLPack), for a next step on the same GPU",
)  # fmt: skip
ALLOW_NONFINITE: Parameter[bool] = Parameter(
    "ALLOW_NONFINITE", False, boolean, "`true` serves NaN/Inf in float inputs", write_value=write_boolean
)
POOL: Parameter[bool] = Parameter(
    "POOL",
    True,
    switch,
    "`off` uses plain allocation (to measure the pool's effect)",
    write_value=write_switch,
)
POOL_KIND: Parameter[str] = Parameter(
    "POOL_KIND", "auto", one_of(*POOL_KINDS), "`auto`, `host`, `pinned`, `cuda`"
)
POOL_LIMIT_BYTES: Parameter[int | None] = Parameter(
    "POOL_LIMIT_BYTES", None, byte_size,
    "hard cap of the instance's pool, e.g. `2GiB`: the instance's own blocks (batches and outputs; "
    "on a GPU pinned staging and device inputs), not torch's own allocations (docs/pool.md)",
)  # fmt: skip
POOL_INITIAL_BYTES: Parameter[int] = Parameter(
    "POOL_INITIAL_BYTES", 0, byte_size,
    "reserved at start, and the pool's floor in the node budget: never lent to other models",
)  # fmt: skip
NODE_BUDGET: Parameter[bool] = Parameter(
    "NODE_BUDGET", True, switch,
    "`on`: the pool reserves from the server's shared memory budget per tier (`TIDEPOOL_MEMORY_BUDGET`, "
    "`tidepool serve --memory-budget`; default 80% of the machine's or device's memory), lends what it "
    "holds above its floor and borrows what others lend (docs/pool.md); `off`: its own limit only",
    write_value=write_switch,
)  # fmt: skip
POOL_WARMUP_BATCH_SIZES: Parameter[tuple[int, ...] | None] = Parameter(
    "POOL_WARMUP_BATCH_SIZES", None, batch_sizes,
    "batch sizes run at load; sizes above `max_batch_size` are clamped", "`1,max_batch_size`",
    write_value=lambda value: sizes_text(value) if value else "",
)  # fmt: skip
POOL_FRAGMENTATION_THRESHOLD: Parameter[float] = Parameter(
    "POOL_FRAGMENTATION_THRESHOLD", 0.10, fraction,
    "fragmentation above which the pool recycles and trims", write_value=lambda value: f"{value:.2f}",
)  # fmt: skip
POOL_RETAIN_HEAP: Parameter[bool] = Parameter(
    "POOL_RETAIN_HEAP", True, boolean,
    "keep torch's freed CPU memory in the process for the next execution", write_value=write_boolean,
)  # fmt: skip


def names(text: str, where: str) -> tuple[str, ...]:
    found = tuple(name.strip() for name in text.split(",") if name.strip())
    if not found:
        raise ConfigError(f"{where}: expected input names separated by commas, got {text!r}")
    return found


LENGTH_GROUPINGS = ("auto", "pad", "exact")

SEQUENCE_INPUTS: Parameter[tuple[str, ...] | None] = Parameter(
    "SEQUENCE_INPUTS", None, names,
    "inputs that share one sequence axis (their first `-1` dim): a request's lengths must agree, and "
    "requests of different lengths are padded together along it (docs/planning.md, text traffic)",
    "every input with a `-1` dim", write_value=lambda value: ",".join(value or ()),
)  # fmt: skip
MAX_SEQUENCE_LENGTH: Parameter[int | None] = Parameter(
    "MAX_SEQUENCE_LENGTH", None, at_least(1),
    "the longest sequence served (e.g. the model's position embeddings); a longer one is refused "
    "with a message that names the limit",
)  # fmt: skip
LENGTH_GROUPING: Parameter[str] = Parameter(
    "LENGTH_GROUPING", "auto", one_of(*LENGTH_GROUPINGS),
    "requests of different lengths in one execution (`allow_ragged_batch: true`): `pad` runs them "
    "together padded on the right to a bucket, token-level outputs cut back to each length; `exact` "
    "runs each length as its own pass; `auto` pads where a check at load finds every output the same "
    "padded as alone, else exact",
)  # fmt: skip
LENGTH_BUCKET: Parameter[int] = Parameter(
    "LENGTH_BUCKET", 16, at_least(1),
    "a pass of several lengths is padded to a multiple of this (at most MAX_SEQUENCE_LENGTH), so "
    "passes take few shapes",
)  # fmt: skip
MAX_BATCH_TOKENS: Parameter[int | None] = Parameter(
    "MAX_BATCH_TOKENS", None, at_least(1),
    "the padded tokens (rows x padded length) one pass may take: more run as several passes, so a "
    "long request does not make short ones wait in a pass of 16 x 512",
)  # fmt: skip
PASS_COST_TOKENS: Parameter[int] = Parameter(
    "PASS_COST_TOKENS", 32, at_least(0),
    "what one more pass costs, in padded tokens: requests of different lengths share a pass unless "
    "padding them together costs more than a pass of their own (`tidepool plan` measures it)",
)  # fmt: skip
LENGTH_MIX: Parameter[LengthMix | None] = Parameter(
    "LENGTH_MIX", None, LengthMix.parse,
    "the sequence lengths traffic has: `64`, `8..512` (uniform) or shares, `8..64:0.7,65..512:0.3`; "
    "what `tidepool plan` planned for (`--lengths`), and what sweep, load and verify send",
    write_value=lambda mix: mix.text if mix else "",
)  # fmt: skip
# Written by `tidepool plan --from-server --apply` on each config it loads: which one, and why.
PLAN_GENERATION: Parameter[int] = Parameter(
    "TIDEPOOL_PLAN_GENERATION", 0, at_least(0), "set by the live re-planner: the config's generation"
)
PLAN_REASON: Parameter[str] = Parameter(
    "TIDEPOOL_PLAN_REASON", "", as_text, "set by the live re-planner: why it loaded this config", "none"
)

# Every parameter, in the README's order. `range.<INPUT>` (a value range per input) is read by
# spec.py with the input it belongs to.
ALL: tuple[Parameter[object], ...] = (
    MODEL_FACTORY, TORCHSCRIPT, EXPORTED_PROGRAM, WEIGHTS, TORCH_NUM_THREADS, ELASTIC_THREADS,
    ELASTIC_HOLD_US, ELASTIC_SPIN_COUNT, PRECISION, GRAPH, DEVICE, GPU_OUTPUTS, ALLOW_NONFINITE, POOL,
    POOL_KIND, POOL_LIMIT_BYTES, POOL_INITIAL_BYTES, NODE_BUDGET, POOL_WARMUP_BATCH_SIZES,
    POOL_FRAGMENTATION_THRESHOLD, POOL_RETAIN_HEAP, SEQUENCE_INPUTS, MAX_SEQUENCE_LENGTH, LENGTH_GROUPING,
    LENGTH_BUCKET, MAX_BATCH_TOKENS, PASS_COST_TOKENS, LENGTH_MIX, PLAN_GENERATION, PLAN_REASON,
)  # type: ignore[assignment]  # fmt: skip


RANGE_ROW = "| `range.<INPUT>` | inclusive `LOW,HIGH` every value of that input must stay within | none |"
PAD_ROW = (
    "| `pad.<INPUT>` | what that sequence input is padded with where requests of different lengths "
    "share a pass (masks and token types: 0) | `0` |"
)
SHAPE_ROW = (
    "| `shape.<INPUT>` | the sizes of that tensor's dims to plan, generate inputs and warm up at, e.g. `128` "
    "for `dims: [ -1 ]` (real traffic's length; `tidepool plan` writes it in the header) | 1 for each `-1` |"
)


def markdown_table() -> str:
    """The README's table of parameters, made from this one (a test checks they are the same)."""
    rows = ["| parameter | meaning | default |", "| --- | --- | --- |"]
    rows += [f"| `{p.name}` | {p.meaning} | {p.documented_default} |" for p in ALL]
    return "\n".join([*rows, RANGE_ROW, SHAPE_ROW, PAD_ROW])


def rewrite_table(readme: Path) -> bool:
    """Put markdown_table() in place of the parameter table in `readme`; whether it changed."""
    text = readme.read_text()
    start = text.index("| parameter | meaning | default |")
    last = next(row for row in (PAD_ROW, SHAPE_ROW, RANGE_ROW) if row in text[start:])
    end = text.index(last, start) + len(last)
    updated = text[:start] + markdown_table() + text[end:]
    readme.write_text(updated)
    return updated != text


if __name__ == "__main__":  # python -m tidepool.parameters README.md
    import sys

    for path in sys.argv[1:] or ["README.md"]:
        print(f"{path}: {'rewritten' if rewrite_table(Path(path)) else 'already current'}")
