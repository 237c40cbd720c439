"""A small DistilBERT for sequence classification from Hugging Face transformers, random weights
from a config (no download): `input_ids` and `attention_mask` of any length up to 512 in, `logits`
out. Text traffic's model: one sequence a request, each of its own length. Seeded, so every process
builds the same weights."""

import torch
from transformers import DistilBertConfig, DistilBertForSequenceClassification


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=30522,
        dim=256,
        n_layers=4,
        n_heads=4,
        hidden_dim=1024,
        max_position_embeddings=512,
        num_labels=2,
    )
    return DistilBertForSequenceClassification(config)
