"""Y = 2 X: a model with no weights, for tests of the backend's memory handling."""

import torch


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def build() -> torch.nn.Module:
    return Doubler()
