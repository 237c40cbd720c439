"""Y = X after 50 ms x the batch's largest X: a model with a known service time, which a request
can stretch (X = 20: a second)."""

import time

import torch


class Sleeper(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.05 * max(1, int(x.max())))
        return x.clone()


def build() -> torch.nn.Module:
    return Sleeper()
