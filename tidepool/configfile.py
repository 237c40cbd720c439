"""config.pbtxt on disk: read as Triton's typed `ModelConfig` protobuf or as the JSON-style dict
Triton hands to `initialize`, and written through protobuf (never string building), with a comment
header, parsed back and compared before it replaces the old file."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelInstanceGroup, ModelQueuePolicy

from tidepool.errors import TidepoolError

__all__ = [
    "ModelConfig",
    "ModelInstanceGroup",
    "ModelQueuePolicy",
    "copy_model",
    "read_config",
    "read_config_dict",
    "set_instances",
    "write_config",
]

# Triton's rate limiter (`--rate-limit=execution_count`) hands a batch to the available instance
# with the lowest executions x priority, so an instance of priority 1 beside one of 1000 takes all
# but one in 1001 of the batches that find both idle, and either takes whatever finds the other
# busy. Each later group's priority is this many times the one before, up to the field's maximum.
PRIORITY_STEP = 1000
MAX_PRIORITY = 2**32 - 1


class ConfigFileError(TidepoolError):
    """A config.pbtxt that cannot be read, or a config that would not be written faithfully."""


def read_config(path: Path | str) -> ModelConfig:
    path = Path(path)
    try:
        return text_format.Parse(path.read_text(), ModelConfig())
    except FileNotFoundError:
        raise ConfigFileError(f"{path}: no such file (a model directory needs a config.pbtxt)") from None
    except text_format.ParseError as exc:
        raise ConfigFileError(f"{path}: not a valid model config: {exc}") from None


def as_dict(config: ModelConfig) -> dict[str, Any]:
    """The config as the JSON-style dict Triton hands to a backend's `initialize`."""
    return json_format.MessageToDict(config, preserving_proto_field_name=True)


def read_config_dict(path: Path | str) -> dict[str, Any]:
    return as_dict(read_config(path))


def config_text(config: ModelConfig, header: Sequence[str] = ()) -> str:
    """The config as config.pbtxt text, with `header` as comment lines on top."""
    body = text_format.MessageToString(config)
    if "max_batch_size" not in body:  # proto3 drops a zero; Triton must see it said explicitly
        body = f"max_batch_size: {config.max_batch_size}\n" + body
    return "".join(f"# {line}\n" for line in header if line) + body


def write_config(path: Path | str, config: ModelConfig, header: Sequence[str] = ()) -> Path:
    """Write atomically, after checking that the text parses back to exactly `config`."""
    path = Path(path)
    text = config_text(config, header)
    parsed = text_format.Parse(text, ModelConfig())
    if as_dict(parsed) != as_dict(config):
        raise ConfigFileError(f"{path}: the text written would not parse back to the same config")
    temporary = path.with_suffix(".pbtxt.tmp")
    temporary.write_text(text)
    temporary.replace(path)
    return path


def copy_model(source: Path, target: Path, config: ModelConfig | None = None) -> Path:
    """A copy of the model directory `source` at `target` (caches left out) whose config, `config`
    or the source's own, is named after `target`."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.tmp"))
    named = ModelConfig()
    named.CopyFrom(config if config is not None else read_config(source / "config.pbtxt"))
    named.name = target.name
    write_config(target / "config.pbtxt", named)
    return target


def set_instances(config: ModelConfig, count: int, prefer_first: bool = False) -> ModelConfig:
    """`config` edited in place to serve `count` instances in each place its groups name (a group
    without its name, count and rate limiter: kind, devices, host policy; with no group, Triton's
    default KIND_AUTO, a GPU where there is one): one group per place, or with `prefer_first`,
    `count` groups of one per place whose rate-limiter priorities keep batches that find several
    instances idle on the first of them (on a server started with `--rate-limit=execution_count`;
    any other server ignores the priorities and serves the same instances). Groups that differ
    only in count or priority merge back."""
    if count < 1:
        raise ConfigFileError(f"an instance count must be at least 1, got {count}")
    places: dict[bytes, ModelInstanceGroup] = {}
    for group in config.instance_group or [ModelInstanceGroup()]:
        place = ModelInstanceGroup()
        place.CopyFrom(group)
        for field in ("name", "count", "rate_limiter"):
            place.ClearField(field)
        places.setdefault(place.SerializeToString(deterministic=True), place)
    del config.instance_group[:]
    for place in places.values():
        for rank in range(count if prefer_first else 1):
            group = config.instance_group.add()
            group.CopyFrom(place)
            group.count = 1 if prefer_first else count
            if prefer_first:
                group.rate_limiter.priority = min(PRIORITY_STEP**rank, MAX_PRIORITY)
    return config


def with_parameters(config: ModelConfig, **parameters: str) -> ModelConfig:
    """A copy of `config` with these backend parameters set (string values, as Triton keeps them)."""
    edited = ModelConfig()
    edited.CopyFrom(config)
    for key, value in parameters.items():
        edited.parameters[key].string_value = value
    return edited
