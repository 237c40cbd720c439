"""A small BERT from Hugging Face transformers, random weights from a config (no download):
`input_ids` and `attention_mask` in, a ModelOutput (a dict) with `last_hidden_state` and
`pooler_output` out. Seeded, so every process builds the same weights."""

import torch
from transformers import BertConfig, BertModel


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertModel(config)
