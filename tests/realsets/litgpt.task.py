"""LitGPT's dependencies at work: Lightning Fabric training steps, a BPE tokenizer trained and used, safetensors
round trip, jsonargparse parsing a signature."""

import tempfile

import jsonargparse
import lightning as L
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

fabric = L.Fabric(accelerator="cpu", devices=1)
model = fabric.setup_module(torch.nn.Linear(8, 2))
optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
for _ in range(3):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer.train_from_iterator(["a small text to learn from"] * 8, trainers.BpeTrainer(special_tokens=["[UNK]"]))
assert tokenizer.encode("small text").ids
with tempfile.TemporaryDirectory() as folder:
    save_file({"w": model.weight.detach().contiguous()}, f"{folder}/m.safetensors")
    assert torch.equal(load_file(f"{folder}/m.safetensors")["w"], model.weight.detach())


def configure(steps: int = 1, name: str = "x") -> dict:
    return {"steps": steps, "name": name}


assert jsonargparse.CLI(configure, args=["--steps", "3"]) == {"steps": 3, "name": "x"}
print("litgpt: fabric steps, BPE, safetensors, jsonargparse")
