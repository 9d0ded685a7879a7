"""Make a tiny LLaMA-architecture model and a tiny instruction dataset, offline.

Run with the recipe environment's Python (torch, transformers and tokenizers live there, not in the
console's environment):

    var/recipe-venv/bin/python tests/slices/recipe_tiny.py <model dir> <dataset dir>

The tokenizer is a word-level tokenizer trained here on the dataset's own text; the model is a
``LlamaConfig`` with tiny sizes saved with ``save_pretrained``. Nothing is downloaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Eight facts, each asked the same way: a LoRA adapter can learn them in a few steps.
FACTS = [
    ("红色", "苹果"),
    ("黄色", "香蕉"),
    ("绿色", "青菜"),
    ("紫色", "葡萄"),
    ("橙色", "橘子"),
    ("白色", "牛奶"),
    ("黑色", "咖啡"),
    ("粉色", "桃子"),
]


def rows() -> list[dict[str, str]]:
    return [
        {"instruction": f"什么 东西 是 {color} 的", "input": "", "output": f"{thing} 是 {color} 的"}
        for color, thing in FACTS
    ]


def main(model_dir: str, dataset_dir: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    data = Path(dataset_dir)
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.json").write_text(json.dumps(rows(), ensure_ascii=False), encoding="utf-8")

    text = [f"### 指令:\n{r['instruction']}\n\n### 回答:\n{r['output']}" for r in rows()]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        text, trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<s>", "</s>"])
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )
    out = Path(model_dir)
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=fast.pad_token_id,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
