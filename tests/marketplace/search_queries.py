"""Real search box queries over the shipped catalogue, with what a person typing them wants to see
in the first five results: the Chinese, English and mixed queries of issue 21 and their neighbours.

Each case names the assets that must be in the top five (``top``) and what else counts as a good
answer (``also``, or a ``rule`` over the asset's facts: "a Qwen model", "a translation dataset").
tests/marketplace/test_search_queries.py asserts the top fives on SQLite and PostgreSQL;
bench/marketplace.py prints precision@5 and the recall of ``top`` in the top five, for the search
and for the substring search it replaced, in the same run. No Django here: rows are plain tuples.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

MODEL, DATASET = "model", "dataset"
TOP = 5


class Row(NamedTuple):
    """The facts of a result a relevance rule may look at."""

    hub_id: str
    name: str
    name_zh: str
    tasks: str  # ";a;b;"
    modalities: str  # ",text,image,"


Rule = Callable[[Row], bool]


def publisher(*prefixes: str) -> Rule:
    return lambda r: r.hub_id.lower().startswith(tuple(p.lower() for p in prefixes))


def size(label: str) -> Rule:
    """The name says this size on a number boundary ("7b": Qwen2-7B, llama-7b-chat; not 57B)."""
    pattern = re.compile(rf"(?<![\d.]){re.escape(label)}(?![a-z])", re.I)
    return lambda r: bool(pattern.search(r.hub_id))


def task(*names: str) -> Rule:
    return lambda r: any(f";{n};" in r.tasks for n in names)


def modality(name: str) -> Rule:
    return lambda r: f",{name}," in r.modalities


def named(*words: str) -> Rule:
    """The hub id, name or Chinese name contains one of ``words`` (case-insensitive)."""
    return lambda r: any(w.lower() in f"{r.hub_id} {r.name} {r.name_zh}".lower() for w in words)


def both(*rules: Rule) -> Rule:
    return lambda r: all(rule(r) for rule in rules)


def either(*rules: Rule) -> Rule:
    return lambda r: any(rule(r) for rule in rules)


DIALOGUE = either(task("conversational"), named("dialog", "conv", "chat", "对话"))


@dataclass(frozen=True)
class Case:
    query: str
    kind: str
    top: tuple[str, ...] = ()  # must all be among the first five
    also: tuple[str, ...] = ()  # also good answers
    rule: Rule | None = None  # what else is a good answer

    @property
    def language(self) -> str:
        chinese = bool(re.search(r"[\u4e00-\u9fff]", self.query))
        latin = bool(re.search(r"[A-Za-z]", self.query))
        return "mixed" if chinese and latin else "zh" if chinese else "en"

    def relevant(self, row: Row) -> bool:
        return (
            row.hub_id in self.top or row.hub_id in self.also or bool(self.rule and self.rule(row))
        )

    def precision(self, results: Sequence[Row]) -> float:
        """precision@5: the good answers among the first five, over five."""
        return sum(self.relevant(r) for r in results[:TOP]) / TOP

    def recall(self, results: Sequence[Row]) -> float | None:
        """The share of ``top`` found in the first five (None when the case names none)."""
        if not self.top:
            return None
        shown = {r.hub_id for r in results[:TOP]}
        return sum(h in shown for h in self.top) / len(self.top)


CHINESE_CHAT_DATA = (
    "lccc",
    "BAAI/COIG",
    "shibing624/alpaca-zh",
    "BelleGroup/train_1M_CN",
)
CHINESE_CHAT_ALSO = ("BelleGroup/train_0.5M_CN", "YeungNLP/firefly-train-1.1M")
CHINESE_INSTRUCTION_DATA = (
    "shibing624/alpaca-zh",
    "BelleGroup/train_0.5M_CN",
    "BelleGroup/train_1M_CN",
    "YeungNLP/firefly-train-1.1M",
    "BAAI/COIG",
)
CHINESE_EVAL = ("haonan-li/cmmlu", "ceval/ceval-exam", "clue")
CHINESE_EVAL_ALSO = (
    "hails/agieval-logiqa-zh",
    "hails/agieval-gaokao-chinese",
    "toksuite/toksuite_chinese",
    "cmrc2018",
)
CHINESE_LLM_FAMILIES = publisher(
    "Qwen/", "THUDM/", "baichuan-inc/", "internlm/", "01-ai/", "openbmb/", "deepseek-ai/"
)
CHAT_NAME = named("chat", "instruct")
BAICHUAN = (
    "baichuan-inc/Baichuan2-7B-Base",
    "baichuan-inc/Baichuan2-7B-Chat",
    "baichuan-inc/Baichuan2-13B-Base",
    "baichuan-inc/Baichuan2-13B-Chat",
)

CASES: tuple[Case, ...] = (
    # --- Chinese datasets: issue 21's query and its variants ---------------------------------
    Case("中文 对话 数据集", DATASET, CHINESE_CHAT_DATA, CHINESE_CHAT_ALSO),
    Case("中文对话数据集", DATASET, CHINESE_CHAT_DATA, CHINESE_CHAT_ALSO),
    Case("找一个中文的对话数据集", DATASET, CHINESE_CHAT_DATA, CHINESE_CHAT_ALSO),
    Case("chinese chat dataset", DATASET, CHINESE_CHAT_DATA, CHINESE_CHAT_ALSO),
    Case("chinese conversation corpus", DATASET, ("lccc",), CHINESE_CHAT_DATA + CHINESE_CHAT_ALSO),
    Case("中文 指令 数据集", DATASET, CHINESE_INSTRUCTION_DATA),
    Case("chinese instruction data", DATASET, CHINESE_INSTRUCTION_DATA),
    Case("中文 微调 数据", DATASET, CHINESE_INSTRUCTION_DATA[:4], CHINESE_INSTRUCTION_DATA),
    Case("指令 belle", DATASET, ("BelleGroup/train_0.5M_CN", "BelleGroup/train_1M_CN")),
    Case("BELLE 中文", DATASET, ("BelleGroup/train_0.5M_CN", "BelleGroup/train_1M_CN")),
    Case("流萤", DATASET, ("YeungNLP/firefly-train-1.1M",)),
    Case("alpaca 中文", DATASET, ("shibing624/alpaca-zh",)),
    Case("中文 评测", DATASET, CHINESE_EVAL, CHINESE_EVAL_ALSO),
    Case("chinese benchmark", DATASET, CHINESE_EVAL, CHINESE_EVAL_ALSO),
    Case("cmmlu", DATASET, ("haonan-li/cmmlu",), rule=named("cmmlu")),
    Case("c-eval", DATASET, ("ceval/ceval-exam",), CHINESE_EVAL + CHINESE_EVAL_ALSO),
    Case(
        "中文 数据集",
        DATASET,
        ("BAAI/COIG", "shibing624/alpaca-zh", "haonan-li/cmmlu"),
        CHINESE_EVAL + CHINESE_EVAL_ALSO + CHINESE_INSTRUCTION_DATA + ("lccc",),
    ),
    Case("对话 数据集", DATASET, rule=DIALOGUE),
    Case("dialogue dataset", DATASET, rule=DIALOGUE),
    Case("医疗 问答", DATASET, ("pubmed_qa", "medical_dialog"), ("bigbio/pubmed_qa",)),
    Case("中文 阅读理解", DATASET, ("cmrc2018",), ("c3",)),
    # --- datasets by task ----------------------------------------------------------------------
    Case("数学 数据集", DATASET, ("openai/gsm8k",), rule=named("math", "gsm8k", "aime")),
    Case("math dataset", DATASET, ("openai/gsm8k",), rule=named("math", "gsm8k", "aime")),
    Case("翻译 数据集", DATASET, rule=task("translation")),
    Case("摘要 数据集", DATASET, rule=task("summarization")),
    Case("问答 数据集", DATASET, rule=task("question-answering")),
    Case("情感分析 数据集", DATASET, rule=named("sentiment", "emotion", "imdb", "sst")),
    Case("squad", DATASET, ("squad", "squad_v2"), rule=named("squad")),
    Case("glue", DATASET, ("glue",), rule=named("glue")),
    # --- Chinese model families, names in Chinese and English ----------------------------------
    Case("qwen 中文", MODEL, ("Qwen/Qwen2-7B",), rule=publisher("Qwen/")),
    Case("通义千问", MODEL, ("Qwen/Qwen2-7B",), rule=publisher("Qwen/")),
    Case(
        "通义千问 7b",
        MODEL,
        ("Qwen/Qwen2-7B", "Qwen/Qwen2.5-7B"),
        rule=both(publisher("Qwen/"), size("7b")),
    ),
    Case(
        "qwen 7b",
        MODEL,
        ("Qwen/Qwen2-7B", "Qwen/Qwen2.5-7B", "Qwen/Qwen1.5-7B"),
        rule=both(publisher("Qwen/"), size("7b")),
    ),
    Case("qwen 1.5b", MODEL, ("Qwen/Qwen2-1.5B", "Qwen/Qwen2.5-1.5B"), rule=size("1.5b")),
    Case(
        "qwen2.5 7b instruct",
        MODEL,
        ("Qwen/Qwen2.5-7B-Instruct",),
        rule=both(named("qwen2.5"), size("7b"), named("instruct")),
    ),
    Case("qwen chat", MODEL, rule=both(publisher("Qwen/"), CHAT_NAME)),
    Case("百川", MODEL, BAICHUAN),
    Case(
        "百川 对话",
        MODEL,
        ("baichuan-inc/Baichuan2-7B-Chat", "baichuan-inc/Baichuan2-13B-Chat"),
        BAICHUAN,
    ),
    Case(
        "baichuan 13b",
        MODEL,
        ("baichuan-inc/Baichuan2-13B-Base", "baichuan-inc/Baichuan2-13B-Chat"),
    ),
    Case("chatglm", MODEL, ("THUDM/chatglm3-6b",), rule=publisher("THUDM/chatglm")),
    Case(
        "智谱 对话",
        MODEL,
        ("THUDM/glm-4-9b-chat", "THUDM/chatglm3-6b"),
        rule=both(publisher("THUDM/"), named("chat")),
    ),
    Case(
        "书生浦语 对话",
        MODEL,
        ("internlm/internlm2-chat-7b",),
        rule=both(publisher("internlm/"), named("chat")),
    ),
    Case(
        "零一万物 34b",
        MODEL,
        ("01-ai/Yi-34B", "01-ai/Yi-34B-Chat"),
        rule=both(publisher("01-ai/"), size("34b")),
    ),
    Case(
        "deepseek",
        MODEL,
        ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3"),
        rule=publisher("deepseek-ai/"),
    ),
    Case(
        "深度求索 推理",
        MODEL,
        ("deepseek-ai/DeepSeek-R1",),
        rule=publisher("deepseek-ai/DeepSeek-R1"),
    ),
    Case(
        "deepseek r1",
        MODEL,
        ("deepseek-ai/DeepSeek-R1",),
        rule=publisher("deepseek-ai/DeepSeek-R1"),
    ),
    Case(
        "中文 对话 模型",
        MODEL,
        ("THUDM/glm-4-9b-chat",),
        rule=both(CHINESE_LLM_FAMILIES, CHAT_NAME),
    ),
    Case("中文 大模型", MODEL, rule=CHINESE_LLM_FAMILIES),
    Case("国产 大模型", MODEL, rule=CHINESE_LLM_FAMILIES),
    Case("70亿 对话 模型", MODEL, rule=both(size("7b"), CHAT_NAME)),
    # --- sizes on number boundaries ------------------------------------------------------------
    Case("7b", MODEL, ("Qwen/Qwen2-7B", "google/gemma-7b"), rule=size("7b")),
    Case("1.5b", MODEL, ("Qwen/Qwen2-1.5B", "Qwen/Qwen2.5-1.5B"), rule=size("1.5b")),
    Case(
        "llama 2 7b",
        MODEL,
        ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"),
        rule=both(named("llama-2"), size("7b")),
    ),
    Case(
        "llama 2 7b chat",
        MODEL,
        ("meta-llama/Llama-2-7b-chat-hf",),
        rule=both(named("llama-2"), size("7b"), CHAT_NAME),
    ),
    Case(
        "llama 3 8b",
        MODEL,
        ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
        ("meta-llama/Meta-Llama-3-8B",),
        rule=both(named("llama-3"), size("8b")),
    ),
    Case(
        "mistral 7b", MODEL, ("mistralai/Mistral-7B-v0.1",), rule=both(named("mistral"), size("7b"))
    ),
    Case(
        "gemma 7b",
        MODEL,
        ("google/gemma-7b", "google/gemma-7b-it"),
        rule=both(named("gemma"), size("7b")),
    ),
    # --- models by task ------------------------------------------------------------------------
    Case("代码 模型", MODEL, ("Qwen/Qwen2.5-Coder-7B-Instruct",), rule=named("code", "starcoder")),
    Case("数学 模型", MODEL, ("Qwen/Qwen2.5-Math-7B-Instruct",), rule=named("math")),
    Case("语音识别", MODEL, rule=task("automatic-speech-recognition")),
    Case("speech recognition", MODEL, rule=task("automatic-speech-recognition")),
    Case(
        "whisper large",
        MODEL,
        ("openai/whisper-large-v3",),
        rule=both(named("whisper"), named("large")),
    ),
    Case("文生图", MODEL, rule=task("text-to-image")),
    Case(
        "多模态 qwen",
        MODEL,
        ("Qwen/Qwen2-VL-7B-Instruct",),
        rule=both(named("qwen"), modality("image")),
    ),
    Case(
        "中文 向量 模型",
        MODEL,
        ("BAAI/bge-large-zh",),
        rule=both(task("embedding"), named("zh", "chinese")),
    ),
    Case(
        "chinese embedding",
        MODEL,
        ("BAAI/bge-large-zh",),
        rule=both(task("embedding"), named("zh", "chinese")),
    ),
    Case(
        "bge 中文",
        MODEL,
        ("BAAI/bge-large-zh", "BAAI/bge-base-zh"),
        rule=both(named("bge"), named("zh")),
    ),
    Case(
        "英文 embedding", MODEL, ("BAAI/bge-large-en",), rule=both(task("embedding"), named("en"))
    ),
    Case("多模态", MODEL, ("Qwen/Qwen2-VL-7B-Instruct",), rule=modality("image")),
    Case("图像 分类", MODEL, rule=task("image-classification", "zero-shot-image-classification")),
    Case("面壁 minicpm", MODEL, rule=publisher("openbmb/MiniCPM")),
)
