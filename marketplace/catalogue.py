"""Read the shipped catalogue files (marketplace/data/) into plain records. No Django imports.

The CSVs hold facts copied from public sources (see data/ATTRIBUTION.md); this module adds only the
values the console derives: the slug, a size estimate where the source has none, and the gated flag
from data/licenses.yaml. `load_catalogue` writes these records to the database.

Besides the shared catalogue's two CSVs it reads three files of the same kind of facts:
``models_extra.csv`` / ``datasets_extra.csv`` (rows the shared catalogue lacks: the Chinese model
families and datasets), ``likes.csv`` (the Hub likes a source gives, the popularity the list is
ordered by) and ``descriptions.yaml`` (Chinese names and descriptions, matched by hub id).
It also holds the search tokenizer, so the document and the query are cut the same way.
"""

from __future__ import annotations

import csv
import fnmatch
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from billing.pricing import GPU_PRODUCTS, gpu_model_key

DATA_DIR = Path(__file__).resolve().parent / "data"
MODELS_CSV = DATA_DIR / "models.csv"
DATASETS_CSV = DATA_DIR / "datasets.csv"
MODELS_EXTRA_CSV = DATA_DIR / "models_extra.csv"
DATASETS_EXTRA_CSV = DATA_DIR / "datasets_extra.csv"
LIKES_CSV = DATA_DIR / "likes.csv"
DESCRIPTIONS_YAML = DATA_DIR / "descriptions.yaml"
LICENSES_YAML = DATA_DIR / "licenses.yaml"
IMAGES_YAML = DATA_DIR / "images.yaml"

MODEL = "model"
DATASET = "dataset"

# bf16 / fp16 weights: two bytes per parameter.
BYTES_PER_PARAM_ESTIMATE = 2

# A slug is what appears after /models/ or /datasets/ on a node: lower-case ASCII, digits, ., _, -,
# starting with a letter or digit, never "..". The mount validation (mounts.py) uses the same rule.
SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,159}$")
# A hub id: "name" or "publisher/name", each part as the Hugging Face Hub allows.
HUB_ID_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


# Search: a word is a run of ASCII letters and digits, or a run of other letters (Chinese has no
# spaces: "通义千问" is one run and matches as a substring, so "千问" finds it too). A middle dot
# joins Chinese names ("书生·浦语"), so it is dropped rather than cutting the name in two.
_WORD_RUN = re.compile(r"[^\W_]+")
_SCRIPT_RUN = re.compile(r"[0-9a-z]+|[^\x00-\x7f]+")
_JOINERS = str.maketrans("", "", "·・‧•")
MAX_QUERY_TERMS = 8


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower().translate(_JOINERS)


def search_terms(text: str) -> list[str]:
    """``"Qwen2.5-7B 通义千问"`` -> ``["qwen2", "5", "7b", "通义千问"]``: lower-case, NFKC-folded
    (full-width ``Ｑｗｅｎ`` is ``qwen``), ASCII words split from runs of other scripts."""
    return [t for run in _WORD_RUN.findall(_fold(text)) for t in _SCRIPT_RUN.findall(run)]


# The search document is these words with a space before and after each, so a pattern can ask for
# a whole word (" zh "), the start of one (" chat") or any substring ("千问"), plus tokens the
# query parser alone asks for, marked with "§" (no query word contains it):
#   §s:7b      a size in a name, cut on number boundaries: "Qwen2.5-7B" and "llama-7b-chat" give
#              §s:7b; "Qwen1.5-57B" gives §s:57b and "Qwen3-1.7B" §s:1.7b, never §s:7b;
#   §n:2.5     a number in a name ("Qwen2.5" -> 2.5, "Llama-2" -> 2), for "llama 3" or "qwen 2.5";
#   §t:… §m:…  the catalogue's task and modality facets (§m:multi: two modalities or more);
#   §l:zh      Chinese: the asset has Chinese text (the shipped catalogue writes Chinese names and
#              descriptions for the Chinese model families and datasets) or says "Chinese", "zh"...
MARK = "§"
_SIZE_IN_NAME = re.compile(r"(?<![\d.])(?<!\dx)(\d+(?:\.\d+)?[bmkt])(?![a-z])")
_NUMBER_IN_NAME = re.compile(r"(?<![\d.])(\d+(?:\.\d+)*)(?![\d.])")
_SIZE = re.compile(r"\d+(?:\.\d+)?[bmkt]")
_NUMBER = re.compile(r"\d+(?:\.\d+)*")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_CHINESE_WORDS = frozenset({"chinese", "zh", "cn", "zhs", "mandarin", "cantonese", "中文", "汉语"})


def _facet(value: str) -> str:
    return "_".join(value.lower().split())


def search_document(
    names: list[str],
    descriptions: list[str],
    *,
    tasks: tuple[str, ...] | list[str] = (),
    modalities: tuple[str, ...] | list[str] = (),
) -> str:
    """The distinct words of an asset's names (hub id, name, Chinese name, publisher, tasks,
    modalities) and of its descriptions, then the marked tokens above. Numbers and sizes count in
    names only: a description that mentions "7B and 13B" must not make the 7B model match "13b"."""
    name_text = _fold(" ".join(names))
    terms = search_terms(name_text)
    description_terms = search_terms(" ".join(descriptions))
    terms += [t for t in description_terms if not any(c.isdigit() for c in t)]
    marked = [f"{MARK}s:{s}" for s in _SIZE_IN_NAME.findall(name_text)]
    marked += [f"{MARK}n:{n}" for n in _NUMBER_IN_NAME.findall(name_text)]
    marked += [f"{MARK}t:{_facet(t)}" for t in tasks if t.strip()]
    marked += [f"{MARK}m:{_facet(m)}" for m in modalities if m.strip()]
    if len([m for m in modalities if m.strip()]) >= 2:
        marked.append(f"{MARK}m:multi")
    all_text = name_text + " ".join(descriptions)
    if _CJK.search(all_text) or _CHINESE_WORDS & {*terms, *description_terms}:
        marked.append(f"{MARK}l:zh")
    return " " + " ".join(dict.fromkeys([*terms, *marked])) + " "


def asset_search_document(
    *,
    hub_id: str,
    name: str,
    name_zh: str,
    publisher: str,
    tasks: list[str],
    modalities: list[str],
    description: str,
    description_zh: str,
) -> str:
    """An asset's search document (``Asset.build_search_document`` and the migrations that
    rebuild the stored documents both call this)."""
    names = [hub_id, name, name_zh, publisher, " ".join(tasks), " ".join(modalities)]
    return search_document(names, [description, description_zh], tasks=tasks, modalities=modalities)


# --- what a query means ---------------------------------------------------------------------------
# People type task words, not the catalogue's facet names: "中文 对话 数据集", "chinese chat dataset".
# Each concept below lists the words that name it (Chinese and English; "fine tune" is two words)
# and the document patterns that satisfy it, in a small notation compiled by `_pattern`:
#   "chat"  the whole word        "chat*"  a word starting so      "对话"  any substring (Chinese)
#   "task:conversational"  a task facet ("task:embedding*": every embedding variant)
#   "modality:image", "lang:zh"  a modality / the language mark
# ``related`` patterns also satisfy the concept but rank below it: instruction data and
# instruction-tuned models are how chat models are made, so "对话" finds BELLE and alpaca-zh
# after LCCC. A kind word ("数据集", "model") filters by kind instead of matching text.


@dataclass(frozen=True)
class Concept:
    key: str
    words: tuple[str, ...]
    match: tuple[str, ...] = ()
    related: tuple[str, ...] = ()
    kind: str = ""
    # Raw substrings of the names (hub id, names, tasks) that make a best match; None: the match
    # patterns' own text. A language is a property, not what a name is about: none.
    hints: tuple[str, ...] | None = None


def _concept(
    key: str,
    words: str,
    match: str = "",
    related: str = "",
    kind: str = "",
    hints: str | None = None,
) -> Concept:
    """A concept from "|"-separated lists (a word or pattern may hold a space: "fine tune")."""

    def split(value: str) -> tuple[str, ...]:
        return tuple(v.strip() for v in value.split("|") if v.strip())

    return Concept(
        key,
        split(words),
        split(match),
        split(related),
        kind,
        None if hints is None else split(hints),
    )


# fmt: off
CONCEPTS: tuple[Concept, ...] = (
    _concept("dataset", "数据集|数据|语料|语料库|dataset|datasets|data|corpus|corpora", kind=DATASET),
    _concept("model", "模型|权重|model|models|weights|checkpoint|checkpoints", kind=MODEL),
    _concept(
        "llm",
        "大模型|大语言模型|语言模型|基座模型|llm|llms|large language model|large language models|"
        "language model|language models",
        match="task:text-generation|task:text2text-generation|llm*|大模型|语言模型",
        kind=MODEL,
        hints="text-generation|llm|大模型|语言模型",
    ),
    _concept("zh", "中文|汉语|华语|简体|简体中文|国产|chinese|zh|cn|mandarin", match="lang:zh", hints=""),
    _concept(
        "en", "英文|英语|english|en", match="english*|en|英文|英语", hints="english|-en|_en|英文|英语"
    ),
    _concept(
        "multilingual",
        "多语言|多语种|multilingual|multi lingual",
        match="multilingual*|多语言|多语种|task:any2any-multilingual-retrieval",
    ),
    _concept(
        "chat",
        "对话|聊天|闲聊|会话|多轮|多轮对话|聊天机器人|chat|chats|chatbot|chatbots|conversation|"
        "conversations|conversational|dialog|dialogs|dialogue|dialogues",
        match="task:conversational|chat|chats|chatbot*|chatglm*|conversation*|dialog*|对话|聊天|会话",
        related="instruct*|指令|sft",
    ),
    _concept(
        "instruct",
        "指令|指令微调|instruct|instruction|instructions|sft",
        match="instruct*|指令|sft",
    ),
    _concept(
        "finetune",
        "微调|精调|finetune|finetuning|finetuned|fine tune|fine tuning|fine tuned",
        match="finetun*|fine tun*|微调|精调|sft",
        related="instruct*|指令",
        hints="finetun|fine-tun|微调|sft",
    ),
    _concept(
        "code",
        "代码|编程|程序|code|codes|coding|coder|programming",
        match="code*|program*|starcoder*|wizardcoder*|leetcode*|代码|编程",
        hints="coder|codellama|codegen|codestral|code-|-code|/code|program|leetcode|代码|编程",
    ),
    _concept(
        "math",
        "数学|算术|math|maths|mathematics|mathematical|arithmetic",
        match="math*|arithmetic*|gsm8k*|数学|算术",
    ),
    _concept(
        "image",
        "图像|图片|视觉|计算机视觉|image|images|vision|visual|photo|photos|picture|pictures",
        match="modality:image|image*|vision*|visual*|图像|图片|视觉",
    ),
    _concept(
        "text_to_image",
        "文生图|图像生成|图片生成|生成图片|绘画|画图|text to image|diffusion|txt2img",
        match="task:text-to-image|diffusion*|文生图|图像生成",
    ),
    _concept(
        "asr",
        "语音识别|语音转文字|语音转写|speech recognition|asr|stt|speech to text",
        match="task:automatic-speech-recognition|asr|语音识别",
        hints="speech-recognition|asr|whisper|语音识别",
    ),
    _concept(
        "speech",
        "语音|音频|声音|语音合成|speech|audio|tts|voice",
        match="modality:audio|speech*|audio*|asr|tts|voice*|语音|音频",
    ),
    _concept("video", "视频|video|videos", match="modality:video|video*|视频"),
    _concept(
        "multimodal",
        "多模态|图文|跨模态|multimodal|multi modal|vlm|vision language",
        match="modality:multi|multimodal*|多模态|vlm*|task:image-text-to-text|"
        "task:visual-question-answering|task:image-to-text",
        hints="multimodal|多模态|-vl|vlm|image-text|visual-question",
    ),
    _concept(
        "translation",
        "翻译|机器翻译|translation|translations|translate|translator|machine translation",
        match="task:translation|translat*|翻译",
    ),
    _concept(
        "summarization",
        "摘要|总结|文摘|概括|summarization|summarisation|summary|summaries|summarize|summarise",
        match="task:summarization|summar*|摘要|总结",
    ),
    _concept(
        "qa",
        "问答|阅读理解|机器阅读理解|qa|question answering",
        match="task:question-answering|task:visual-question-answering|qa*|问答|阅读理解",
        hints="question-answering|qa|问答|阅读理解",
    ),
    _concept(
        "classification",
        "分类|文本分类|classification|classifier|classify",
        match="classif*|分类",
    ),
    _concept(
        "sentiment",
        "情感|情感分析|情绪|sentiment|emotion|emotions",
        match="sentiment*|emotion*|情感|情绪",
    ),
    _concept(
        "ner",
        "实体|命名实体|命名实体识别|ner|entity|entities",
        match="ner|entit*|task:token-classification|实体",
        hints="-ner|_ner|ner-|entit|token-classification|实体",
    ),
    _concept(
        "embedding",
        "向量|嵌入|向量化|检索|语义检索|embedding|embeddings|retrieval",
        match="task:embedding*|task:text-retrieval|task:retrieval|embed*|retriev*|向量|嵌入|检索",
        hints="embed|retriev|向量|嵌入|检索",
    ),
    _concept(
        "eval",
        "评测|测评|基准|评估|榜单|考试|benchmark|benchmarks|eval|evaluation|exam|leaderboard",
        match="benchmark*|eval*|exam*|评测|测评|基准|评估|考试",
        related="task:multiple-choice",
        hints="benchmark|ceval|-eval|eval-|_eval|mmlu|exam|评测|测评|基准|评估|考试",
    ),
    _concept("reasoning", "推理|reasoning", match="reason*|推理"),
    _concept(
        "medical",
        "医疗|医学|医药|临床|medical|medicine|clinical|biomedical",
        match="medic*|clinic*|biomed*|pubmed*|医疗|医学|医药|临床",
    ),
    _concept("legal", "法律|法务|legal|law", match="legal*|law|laws|法律"),
    _concept("finance", "金融|财经|finance|financial", match="financ*|金融|财经"),
)
# fmt: on

# Words that carry nothing to search for ("找一个中文的对话数据集": 找 一个 的).
STOP_WORDS = frozenset(
    {"a", "an", "the", "and", "or", "of", "for", "with", "in", "on", "to", "by", "some", "any",
     "的", "和", "与", "及", "或", "找", "我想要", "我要", "我想", "一个", "一些", "有没有", "推荐",
     "哪些", "什么", "相关", "关于", "用于", "适合", "可以", "开源", "训练", "好用", "最好"}
)  # fmt: skip

_CONCEPT_BY_WORD: dict[str, Concept] = {}
for _each in CONCEPTS:
    for _word in _each.words:
        _CONCEPT_BY_WORD.setdefault(_word, _each)
# Phrases ("fine tune") by their first word, longest first; Chinese words for cutting a run of
# Chinese characters, longest first ("多轮对话" before "对话").
_PHRASES: dict[str, list[tuple[str, ...]]] = {}
for _word in sorted(_CONCEPT_BY_WORD, key=lambda w: -len(w.split())):
    if " " in _word:
        _PHRASES.setdefault(_word.split()[0], []).append(tuple(_word.split()))
_CHINESE_VOCABULARY = sorted(
    {w for w in [*_CONCEPT_BY_WORD, *STOP_WORDS] if not w.isascii()}, key=len, reverse=True
)
# "70亿" is 7B, "15亿" 1.5B: Chinese writes parameter counts in units of 10^8.
_YI = re.compile(r"(\d+(?:\.\d+)?)\s*亿")
_QUERY_WORD = re.compile(r"[0-9a-z]+(?:\.[0-9a-z]+)*|(?:(?![\x00-\x7f])[^\W_])+")


def _pattern(spec: str) -> str:
    """A vocabulary pattern (see above) as the substring the search document must contain."""
    for prefix, mark in (("task:", "t"), ("modality:", "m"), ("lang:", "l")):
        if spec.startswith(prefix):
            value = spec.removeprefix(prefix)
            if value.endswith("*"):
                return f" {MARK}{mark}:{_facet(value[:-1])}"
            return f" {MARK}{mark}:{_facet(value)} "
    if not spec.isascii():
        return spec
    return f" {spec[:-1]}" if spec.endswith("*") else f" {spec} "


def _hint(spec: str) -> str:
    """The raw text a pattern stands for in an asset's names (hub id, names, tasks)."""
    return spec.split(":", 1)[-1].rstrip("*").replace(" ", "-")


@dataclass(frozen=True)
class Clause:
    """One thing a query asks for: any one of ``patterns`` must be a substring of the document.

    For ranking, ``hints`` (and, a step lower, ``related_hints``) are looked for in the asset's
    names, and ``evidence`` in the whole document (the concept itself, not a related one)."""

    text: str
    patterns: tuple[str, ...]
    hints: tuple[str, ...]
    related_hints: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    role: str = "word"  # "word" (found as typed), "size", "number" or "concept"

    def matches(self, document: str) -> bool:
        return any(p in document for p in self.patterns)


@dataclass(frozen=True)
class SearchQuery:
    """A search box query, understood: the kind it names ("" for none) and what it asks for."""

    kind: str
    clauses: tuple[Clause, ...]

    @property
    def words(self) -> list[str]:
        """The plain words typed (not concepts, sizes or numbers), in order."""
        return [c.text for c in self.clauses if c.role == "word"]

    def matches(self, document: str, kind: str = "") -> bool:
        """What the database does with the query, in Python (the tests and the benchmark)."""
        if self.kind and kind and kind != self.kind:
            return False
        return all(c.matches(document) for c in self.clauses)


def _concept_clause(concept: Concept, text: str) -> Clause:
    match = tuple(_pattern(p) for p in concept.match)
    related = tuple(_pattern(p) for p in concept.related)
    return Clause(
        text=text,
        patterns=match + related,
        hints=(
            concept.hints
            if concept.hints is not None
            else tuple(dict.fromkeys(_hint(p) for p in concept.match))
        ),
        related_hints=tuple(dict.fromkeys(_hint(p) for p in concept.related)),
        evidence=match,
        role="concept",
    )


def _word_clauses(word: str) -> list[Clause]:
    if _SIZE.fullmatch(word):
        # A size matches on number boundaries: "7b" is 7B and 7b-chat, never 57B or 1.7B.
        return [Clause(word, (f" {MARK}s:{word} ",), (word,), role="size")]
    if _NUMBER.fullmatch(word):
        # "2" is Llama-2 and Qwen2.5 (2.x), not 13B or v1.2.
        return [Clause(word, (f" {MARK}n:{word} ", f" {MARK}n:{word}."), (word,), role="number")]
    return [Clause(t, (t,), (t,)) for t in search_terms(word)]


def _segment(run: str) -> list[str]:
    """Cut a run of Chinese characters at the vocabulary's words: "中文对话数据集" -> 中文 对话 数据集;
    what lies between stays one word ("通义千问")."""
    pieces: list[str] = []
    rest = ""
    i = 0
    while i < len(run):
        word = next((w for w in _CHINESE_VOCABULARY if run.startswith(w, i)), None)
        if word is None:
            rest += run[i]
            i += 1
            continue
        if rest:
            pieces.append(rest)
            rest = ""
        pieces.append(word)
        i += len(word)
    if rest:
        pieces.append(rest)
    return pieces


def parse_query(q: str) -> SearchQuery:
    """What a search box query asks for: every clause must match (at most eight).

    Kind words set the kind; stop words go; task, language and modality words become concepts
    (any of their patterns); sizes and numbers match on number boundaries; every other word must
    be a substring of the document, as before."""
    folded = _YI.sub(lambda m: f" {float(m.group(1)) / 10:g}b ", _fold(q))
    words: list[str] = []
    for word in _QUERY_WORD.findall(folded):
        words.extend(_segment(word) if not word.isascii() else [word])
    kinds: set[str] = set()
    clauses: dict[str, Clause] = {}
    i = 0
    while i < len(words):
        word = words[i]
        phrase = next(
            (p for p in _PHRASES.get(word, []) if tuple(words[i : i + len(p)]) == p), None
        )
        if phrase is not None:
            word = " ".join(phrase)
        i += len(phrase) if phrase else 1
        if word in STOP_WORDS:
            continue
        concept = _CONCEPT_BY_WORD.get(word)
        if concept is None:
            for clause in _word_clauses(word):
                clauses.setdefault(clause.patterns[0], clause)
            continue
        if concept.kind:
            kinds.add(concept.kind)
        if concept.match:
            clauses.setdefault(concept.key, _concept_clause(concept, word))
    kind = kinds.pop() if len(kinds) == 1 else ""
    return SearchQuery(kind=kind, clauses=tuple(clauses.values())[:MAX_QUERY_TERMS])


def query_terms(q: str) -> list[str]:
    """The plain words of a query (at most eight): what must occur as typed."""
    return parse_query(q).words


class CatalogueError(ValueError):
    """A catalogue file holds a row the console cannot use; the message names file and row."""


def is_valid_slug(slug: str) -> bool:
    return bool(SLUG_RE.fullmatch(slug)) and ".." not in slug


def is_valid_hub_id(hub_id: str) -> bool:
    parts = hub_id.split("/")
    return (
        1 <= len(parts) <= 2
        and all(HUB_ID_PART_RE.fullmatch(p) for p in parts)
        and not any(p in {".", ".."} or ".." in p for p in parts)
    )


def slug_for(hub_id: str) -> str:
    """`meta-llama/Llama-2-7b-hf` -> `meta-llama--llama-2-7b-hf` (unique: hub ids are unique
    case-insensitively, and `--` never occurs in a Hub repo name)."""
    if not is_valid_hub_id(hub_id):
        raise CatalogueError(f"not a hub id: {hub_id!r}")
    slug = hub_id.lower().replace("/", "--")
    if not is_valid_slug(slug):
        raise CatalogueError(f"hub id {hub_id!r} gives an unusable slug {slug!r}")
    return slug


def _split(value: str, sep: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v.strip() for v in value.split(sep) if v.strip()))


def _float(value: str, where: str) -> float | None:
    if not value.strip():
        return None
    try:
        number = float(value)
    except ValueError as exc:
        raise CatalogueError(f"{where}: not a number: {value!r}") from exc
    if number < 0:
        raise CatalogueError(f"{where}: negative: {value!r}")
    return number


@dataclass(frozen=True)
class LicenseRecord:
    key: str
    name: str
    url: str = ""
    gated: bool = False
    terms: str = ""


@dataclass(frozen=True)
class AssetRecord:
    kind: str  # MODEL or DATASET
    hub_id: str
    slug: str
    name: str
    publisher: str
    tasks: tuple[str, ...]
    modalities: tuple[str, ...]
    params_billion: float | None
    size_gb: float | None
    size_estimated: bool
    license: str  # "" = the source gives none
    source: str
    likes: int | None = None  # Hub likes, as a source gives them; None = unknown
    name_zh: str = ""
    description: str = ""
    description_zh: str = ""

    @property
    def task(self) -> str:
        return self.tasks[0] if self.tasks else ""


def estimate_size_gb(params_billion: float | None) -> float | None:
    """Weights on disk at bf16: parameters × 2 bytes, in 10^9 bytes."""
    if params_billion is None:
        return None
    return round(params_billion * BYTES_PER_PARAM_ESTIMATE, 3)


def read_assets(kind: str, path: Path | None = None) -> Iterator[AssetRecord]:
    """Yield one record per CSV row, with the derived values filled in."""
    if kind not in (MODEL, DATASET):
        raise CatalogueError(f"unknown asset kind {kind!r}")
    path = path or (MODELS_CSV if kind == MODEL else DATASETS_CSV)
    with path.open(newline="", encoding="utf-8") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            where = f"{path.name}:{line}"
            hub_id = row["hub_id"].strip()
            params = _float(row.get("params_billion", ""), where) if kind == MODEL else None
            size = _float(row.get("size_gb", ""), where)
            estimated = False
            if size is None and kind == MODEL:
                size = estimate_size_gb(params)
                estimated = size is not None
            publisher = row["publisher"].strip() or (hub_id.split("/")[0] if "/" in hub_id else "")
            yield AssetRecord(
                kind=kind,
                hub_id=hub_id,
                slug=slug_for(hub_id),
                name=row["name"].strip() or hub_id,
                publisher=publisher,
                tasks=_split(row["task"], ";"),
                modalities=_split(row["modality"], ","),
                params_billion=params,
                size_gb=size,
                size_estimated=estimated,
                license=row["license"].strip(),
                source=row["source"].strip(),
            )


@dataclass(frozen=True)
class Likes:
    likes: int
    source: str


def read_likes(path: Path = LIKES_CSV) -> dict[tuple[str, str], Likes]:
    """``(kind, hub id) -> Likes``: the Hub likes a public source recorded for an asset."""
    likes: dict[tuple[str, str], Likes] = {}
    if not path.exists():
        return likes
    with path.open(newline="", encoding="utf-8") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            where = f"{path.name}:{line}"
            key = (row["kind"].strip(), row["hub_id"].strip())
            if key[0] not in (MODEL, DATASET) or key in likes:
                raise CatalogueError(f"{where}: unknown kind or repeated hub id {key!r}")
            value = _float(row["likes"], where)
            if value is None or value != int(value):
                raise CatalogueError(f"{where}: likes must be a whole number: {row['likes']!r}")
            likes[key] = Likes(likes=int(value), source=row["source"].strip())
    return likes


@dataclass(frozen=True)
class Description:
    """Chinese name and descriptions for the assets whose hub id matches one of ``match``."""

    kind: str
    match: tuple[str, ...]  # hub ids or shell patterns ("Qwen/*"), case-insensitive
    name_zh: str  # "{name}" is replaced by the asset's name
    description: str
    description_zh: str
    source: str

    def matches(self, kind: str, hub_id: str) -> bool:
        hub = hub_id.lower()
        return kind == self.kind and any(fnmatch.fnmatchcase(hub, m.lower()) for m in self.match)


def read_descriptions(path: Path = DESCRIPTIONS_YAML) -> list[Description]:
    """The entries of descriptions.yaml, in file order (the first entry that matches wins)."""
    if not path.exists():
        return []
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    entries = []
    for n, spec in enumerate(raw, start=1):
        where = f"{path.name} entry {n}"
        kind = str(spec.get("kind", ""))
        match = spec.get("match") or []
        if kind not in (MODEL, DATASET) or not match or not spec.get("source"):
            raise CatalogueError(f"{where}: needs a kind, hub ids to match and a source")
        entries.append(
            Description(
                kind=kind,
                match=tuple(str(m) for m in ([match] if isinstance(match, str) else match)),
                name_zh=" ".join(str(spec.get("name_zh", "")).split()),
                description=" ".join(str(spec.get("description", "")).split()),
                description_zh=" ".join(str(spec.get("description_zh", "")).split()),
                source=" ".join(str(spec["source"]).split()),
            )
        )
    return entries


def _with_source(source: str, extra: str) -> str:
    parts = [p.strip() for p in source.split(" + ")]
    return source if extra in parts else f"{source} + {extra}"


def read_catalogue(
    kind: str,
    base: Path | None = None,
    extra: Path | None = None,
    likes_csv: Path = LIKES_CSV,
    descriptions_yaml: Path = DESCRIPTIONS_YAML,
) -> list[AssetRecord]:
    """Every shipped asset of ``kind``: the shared catalogue's rows, then the added rows, with the
    likes and the Chinese names and descriptions merged in. Each source used is named in the
    record's ``source`` (joined by `` + ``). A hub id in both files is an error."""
    if kind not in (MODEL, DATASET):
        raise CatalogueError(f"unknown asset kind {kind!r}")
    base = base or (MODELS_CSV if kind == MODEL else DATASETS_CSV)
    extra = extra or (MODELS_EXTRA_CSV if kind == MODEL else DATASETS_EXTRA_CSV)
    records = list(read_assets(kind, base))
    seen = {r.hub_id.lower() for r in records}
    if extra.exists():
        for rec in read_assets(kind, extra):
            if rec.hub_id.lower() in seen:
                raise CatalogueError(f"{extra.name}: {rec.hub_id} is already in {base.name}")
            seen.add(rec.hub_id.lower())
            records.append(rec)
    likes = read_likes(likes_csv)
    descriptions = read_descriptions(descriptions_yaml)
    merged = []
    for rec in records:
        changes: dict[str, Any] = {}
        found = likes.get((kind, rec.hub_id))
        if found is not None:
            changes["likes"] = found.likes
            changes["source"] = _with_source(rec.source, found.source)
        entry = next((d for d in descriptions if d.matches(kind, rec.hub_id)), None)
        if entry is not None:
            changes["name_zh"] = entry.name_zh.replace("{name}", rec.name)
            changes["description"] = entry.description
            changes["description_zh"] = entry.description_zh
            changes["source"] = _with_source(changes.get("source", rec.source), entry.source)
        merged.append(replace(rec, **changes) if changes else rec)
    return merged


def read_licenses(path: Path = LICENSES_YAML) -> dict[str, LicenseRecord]:
    raw: dict[str, dict[str, Any]] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {
        key: LicenseRecord(
            key=key,
            name=str(spec.get("name") or key),
            url=str(spec.get("url") or ""),
            gated=bool(spec.get("gated", False)),
            terms=str(spec.get("terms") or "").strip(),
        )
        for key, spec in raw.items()
    }


def license_record(key: str, known: dict[str, LicenseRecord]) -> LicenseRecord:
    """The record for a license id; an id not in licenses.yaml is shown as itself, not gated."""
    if key in known:
        return known[key]
    url = key if key.startswith(("http://", "https://")) else ""
    return LicenseRecord(key=key, name=key, url=url)


@dataclass(frozen=True)
class Port:
    name: str
    port: int
    protocol: str = "tcp"


@dataclass(frozen=True)
class LaunchTemplate:
    command: str
    workdir: str
    ports: tuple[Port, ...]
    env: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "workdir": self.workdir,
            "ports": [{"name": p.name, "port": p.port, "protocol": p.protocol} for p in self.ports],
            "env": dict(self.env),
        }


@dataclass(frozen=True)
class ImageVersionRecord:
    slug: str
    framework_version: str
    cuda: str
    cudnn: str
    python: str
    container: str
    size_gb: float
    gpus: tuple[str, ...]
    contents: tuple[str, ...]
    layer: tuple[str, ...]
    recommended: bool
    launch: LaunchTemplate


@dataclass(frozen=True)
class ImageRecord:
    slug: str
    name: str
    framework: str
    homepage: str
    summary: str
    versions: tuple[ImageVersionRecord, ...]


# GPU model codes as the fleet names them (slices/fleets/*.yaml), and how people write them: billing's
# keys and product names (``billing.pricing.GPU_PRODUCTS``), the one list of them.
GPU_LABELS = {gpu_model_key(name): name for name in GPU_PRODUCTS}
GPU_MODELS = tuple(GPU_LABELS)


def gpu_code(value: str) -> str:
    """Billing's key of a known card however it is written (``"RTX 4090"``, ``"rtx-4090"``,
    ``"ＲＴＸ４０９０"`` -> ``"RTX4090"``, ``billing.pricing.gpu_model_key``); "" for anything else."""
    code = gpu_model_key(str(value))
    return code if code in GPU_LABELS else ""


# docker reference: [registry/]repo[:tag], lower-case repo path, no digest needed here.
CONTAINER_RE = re.compile(
    r"^(?:[a-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
)


def _launch(base: dict[str, Any], override: dict[str, Any] | None) -> LaunchTemplate:
    merged = dict(base)
    for key, value in (override or {}).items():
        if key == "env":
            merged["env"] = {**merged.get("env", {}), **value}
        else:
            merged[key] = value
    ports = tuple(
        Port(name=str(p["name"]), port=int(p["port"]), protocol=str(p.get("protocol", "tcp")))
        for p in merged.get("ports", [])
    )
    return LaunchTemplate(
        command=" ".join(str(merged.get("command", "")).split()),
        workdir=str(merged.get("workdir", "/workspace")),
        ports=ports,
        env={str(k): str(v) for k, v in merged.get("env", {}).items()},
    )


def read_images(path: Path = IMAGES_YAML) -> list[ImageRecord]:
    """Parse images.yaml, merging each image's launch template over the defaults, and validate."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    default_launch = raw.get("defaults", {}).get("launch", {})
    images: list[ImageRecord] = []
    seen: set[str] = set()
    for spec in raw["images"]:
        image_launch = _launch(default_launch, spec.get("launch")).as_dict()
        versions = []
        for v in spec["versions"]:
            slug = str(v["slug"])
            if not is_valid_slug(slug) or slug in seen:
                raise CatalogueError(f"image version slug {slug!r} is invalid or repeated")
            seen.add(slug)
            container = str(v["container"])
            if not CONTAINER_RE.fullmatch(container):
                raise CatalogueError(f"{slug}: not a container reference: {container!r}")
            gpus = tuple(gpu_code(g) for g in v["gpus"])
            if "" in gpus:
                raise CatalogueError(f"{slug}: unknown GPU models in {v['gpus']}")
            versions.append(
                ImageVersionRecord(
                    slug=slug,
                    framework_version=str(v["framework_version"]),
                    cuda=str(v["cuda"]),
                    cudnn=str(v.get("cudnn", "")),
                    python=str(v["python"]),
                    container=container,
                    size_gb=float(v["size_gb"]),
                    gpus=gpus,
                    contents=tuple(str(c) for c in v.get("contents", ())),
                    layer=tuple(str(c) for c in v.get("layer", ())),
                    recommended=bool(v.get("recommended", False)),
                    launch=_launch(image_launch, v.get("launch")),
                )
            )
        images.append(
            ImageRecord(
                slug=str(spec["slug"]),
                name=str(spec["name"]),
                framework=str(spec["framework"]),
                homepage=str(spec.get("homepage", "")),
                summary=" ".join(str(spec.get("summary", "")).split()),
                versions=tuple(versions),
            )
        )
    return images
