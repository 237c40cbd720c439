"""Reads Triton's Prometheus endpoint (/metrics) into plain Python values."""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and not line.startswith("#"):
            labels = dict(_LABEL.findall(match.group(2) or ""))
            samples.append(Sample(match.group(1), labels, float(match.group(3))))
    return samples


def scrape(url: str, timeout_s: float = 5.0) -> list[Sample]:
    """All samples from a metrics URL such as http://127.0.0.1:8002/metrics."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse_metrics(response.read().decode())


def values(samples: list[Sample], name: str, **labels: str) -> list[float]:
    """Every sample called `name` whose labels include `labels` (one per instance of a model, say);
    KeyError if there is none."""
    found = [
        sample.value
        for sample in samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]
    if not found:
        raise KeyError(f"no metric {name} with labels {labels}")
    return found


def value(samples: list[Sample], name: str, **labels: str) -> float:
    """The first sample called `name` whose labels include `labels`: for labels that name one
    sample, or a figure every instance of a model reports alike; KeyError if there is none."""
    return values(samples, name, **labels)[0]
