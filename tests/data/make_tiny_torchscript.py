#!/usr/bin/python3
"""Writes tiny_mlp.pt: a small TorchScript classifier for 1x28x28 inputs, the
"bring your own model" example and test fixture. Needs Debian's python3-torch:

    /usr/bin/python3 tests/data/make_tiny_torchscript.py tests/data/tiny_mlp.pt
"""
import sys

import torch


class TinyMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(28 * 28, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.jit.script(TinyMlp()).save(sys.argv[1] if len(sys.argv) > 1 else "tiny_mlp.pt")
