"""Make tiny models for the AI application servers' tests, offline.

Run with the recipe environment's Python (torch, transformers and tokenizers live there, not in the
console's environment):

    var/recipe-venv/bin/python tests/marketplace/app_tiny.py chat <model dir>

``chat`` writes a tiny LLaMA-architecture chat model: a word-level tokenizer trained here on a few
Chinese and English chat lines, with chat special tokens and a Jinja ``chat_template`` (so the
server's ``apply_chat_template`` path is the one exercised), and a ``LlamaConfig`` with tiny sizes
and random weights saved with ``save_pretrained``. Nothing is downloaded; it takes a few seconds.

Other apps' helpers live in their own ``tiny_*.py`` files beside this one.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Words for the tokenizer's vocabulary: what the tests' questions use, plus enough for the random
# model to pick varied words (space-separated; the tokenizer is word-level).
CHAT_LINES = [
    "你好 请 介绍 一下 你 自己",
    "我 是 一个 很 小 的 测试 模型",
    "今天 天气 很 好 我们 去 公园 散步 吧",
    "hello please introduce yourself",
    "I am a very small test model",
    "the weather is nice today let us go for a walk",
    "what is the capital of France",
    "Paris is the capital of France",
    "一 二 三 四 五 六 七 八 九 十",
    "one two three four five six seven eight nine ten",
]

# The chat markers are special tokens: the tokenizer matches them before splitting on whitespace
# and punctuation, so ``<|user|>`` stays one token, and ``skip_special_tokens`` drops them from
# the decoded answer.
CHAT_SPECIALS = ["<pad>", "<unk>", "<s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]

# One message per turn, ``<|end|>`` (the end-of-sequence token) closes each; a generation prompt
# opens the assistant's turn. Roles other than system/user/assistant are sent as user turns.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>"
    "{% elif message['role'] == 'assistant' %}<|assistant|>"
    "{% else %}<|user|>{% endif %}"
    " {{ message['content'] }} <|end|> "
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def make_chat(model_dir: str) -> None:
    """A tiny chat model whose greedy answers are several words long.

    The weights are random, so an answer is whatever the model picks; the generation config keeps
    it from picking the chat markers (which would decode to nothing) and from ending before a few
    words, so a test always sees visible, streamed text.
    """
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        CHAT_LINES, trainers.WordLevelTrainer(special_tokens=CHAT_SPECIALS, min_frequency=1)
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|end|>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=fast.pad_token_id,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    never = [fast.convert_tokens_to_ids(t) for t in CHAT_SPECIALS if t != "<|end|>"]
    model.generation_config = GenerationConfig(
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        suppress_tokens=never,
        min_new_tokens=4,
    )
    model.save_pretrained(out)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in {"chat"}:
        print("usage: app_tiny.py chat <model dir>", file=sys.stderr)
        return 2
    make_chat(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
