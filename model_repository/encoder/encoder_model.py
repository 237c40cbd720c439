"""`encoder`: a small BERT-like transformer encoder, weights made from a fixed seed at load."""

import torch
from torch import nn

VOCAB, SEQ, HIDDEN, HEADS, FFN, LAYERS = 30522, 128, 256, 4, 1024, 4


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, HIDDEN)
        self.positions = nn.Parameter(torch.randn(1, SEQ, HIDDEN) * 0.02)
        layer = nn.TransformerEncoderLayer(
            HIDDEN, HEADS, FFN, dropout=0.0, activation="gelu", batch_first=True
        )
        self.layers = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(input_ids.long()) + self.positions[:, : input_ids.shape[1]]
        hidden = self.norm(self.layers(hidden))
        return hidden.mean(dim=1)  # EMBEDDING: mean-pooled last hidden state


def build() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Encoder()
