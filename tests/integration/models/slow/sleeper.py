"""Y = X after 50 ms: a model with a known, fixed service time."""

import time

import torch


class Sleeper(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.05)
        return x.clone()


def build() -> torch.nn.Module:
    return Sleeper()
