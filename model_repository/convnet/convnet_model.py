"""`convnet`: a small ResNet-style image classifier, weights made from a fixed seed at load."""

import torch
from torch import nn


def conv_bn(channels_in: int, channels_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False),
        nn.BatchNorm2d(channels_out),
    )


class BasicBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.first = conv_bn(channels_in, channels_out, stride)
        self.second = conv_bn(channels_out, channels_out)
        self.shortcut = (
            nn.Identity()
            if stride == 1 and channels_in == channels_out
            else nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride, bias=False),
                nn.BatchNorm2d(channels_out),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.first(x))
        return torch.relu(self.second(out) + self.shortcut(x))


class ConvNet(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 7, 2, 3, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        widths = [32, 64, 128, 256]
        blocks = [BasicBlock(32, widths[0], 1)]
        blocks += [BasicBlock(a, b, 2) for a, b in zip(widths, widths[1:], strict=False)]
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(image))
        return self.head(features.mean(dim=(2, 3)))  # LOGITS


def build() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ConvNet()
