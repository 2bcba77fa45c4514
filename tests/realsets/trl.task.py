"""TRL's task: SFTTrainer, two steps, on a tiny Llama and a word-level tokenizer made here."""

import tempfile

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

words = ["<pad>", "<s>", "</s>", "<unk>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
core.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
)
config = LlamaConfig(
    vocab_size=len(words),
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=32,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
data = Dataset.from_dict({"text": ["the cat sat on the mat", "a dog ran on a mat"] * 4})
with tempfile.TemporaryDirectory() as out:
    args = SFTConfig(output_dir=out, max_steps=2, per_device_train_batch_size=2, report_to=[], use_cpu=True)
    trainer = SFTTrainer(model=LlamaForCausalLM(config), args=args, train_dataset=data, processing_class=tokenizer)
    result = trainer.train()
print("trl: SFTTrainer 2 steps, loss", result.training_loss)
