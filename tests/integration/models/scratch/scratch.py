"""Y = X + 1, by way of a 48 MiB intermediate tensor (a stand-in for a large activation)."""

import torch

SCRATCH_ELEMENTS = 12 * 2**20  # float32: 48 MiB


class Scratch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.ones(SCRATCH_ELEMENTS, dtype=x.dtype)  # written in full: every page touched
        return x + scratch[-1]


def build() -> torch.nn.Module:
    return Scratch()
