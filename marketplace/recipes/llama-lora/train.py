"""LoRA fine-tuning of a LLaMA-architecture model on an instruction dataset (PEFT + Transformers).

Launched by torchrun, one process per GPU (data parallel; NCCL on GPUs, gloo on the CPU):

    torchrun --nproc_per_node 8 train.py --model /models/<slug> --dataset /datasets/<slug> \
        --output /pfs --run-name <name> --max-steps 300 --time-limit 1500

Reads the mounted model (a ``save_pretrained`` directory with its tokenizer) and dataset (JSON or
JSON Lines of ``{"instruction", "input", "output"}`` rows, the alpaca format). Nothing is
downloaded.

Checkpoints (the console documents this convention): ``<output>/checkpoints/<run>/step-<N>/``
holds the adapter (``adapter_model.safetensors``, ``adapter_config.json``), ``optimizer.pt`` and
``trainer_state.json``; a checkpoint appears complete or not at all (written beside, then renamed).
``RESUME_FROM`` (or ``--resume``) is a checkpoint directory, ``auto`` (the default: the run's
latest checkpoint, if any; what a migrated instance restarting the same run does) or ``none``.
At the end the adapter is saved to ``<output>/adapters/<run>/``.

Rank 0 prints one JSON object per line for the console (any other output is plain text):

    {"event": "start", "run", "world_size", "device", "trainable_params", "total_params",
     "max_steps", "resumed_from": step or null}
    {"event": "progress", "step", "max_steps", "loss", "lr", "tokens_per_s", "eta_s", "elapsed_s"}
    {"event": "checkpoint", "step", "path"}
    {"event": "done", "step", "loss", "adapter", "reason": "max_steps" | "time_limit",
     "elapsed_s"}
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import transformers
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT = "### 指令:\n{instruction}\n{input}\n### 回答:\n"
# Stop this much before the time limit: the adapter must be saved before the instance is released.
SAVE_MARGIN_S = 30.0


def emit(rank: int, event: str, **fields: Any) -> None:
    if rank == 0:
        print(json.dumps({"event": event, **fields}, ensure_ascii=False), flush=True)


def say(rank: int, text: str) -> None:
    if rank == 0:
        print(text, flush=True)


def env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=env("MODEL_DIR", "/models/model"))
    p.add_argument("--dataset", default=env("DATASET_DIR", "/datasets/dataset"))
    p.add_argument("--output", default=env("PFS", "/pfs"))
    p.add_argument("--run-name", default=env("CHECKPOINT_RUN", env("RUN_NAME", "llama-lora")))
    p.add_argument("--max-steps", type=int, default=int(env("MAX_STEPS", "300")))
    p.add_argument("--time-limit", type=float, default=float(env("TIME_LIMIT_S", "0")))
    p.add_argument("--batch-size", type=int, default=int(env("BATCH_SIZE", "4")))
    p.add_argument("--seq-len", type=int, default=int(env("SEQ_LEN", "512")))
    p.add_argument("--lr", type=float, default=float(env("LR", "2e-4")))
    p.add_argument("--lora-r", type=int, default=int(env("LORA_R", "8")))
    p.add_argument("--lora-targets", default=env("LORA_TARGETS", "q_proj,v_proj"))
    p.add_argument("--save-every", type=int, default=int(env("SAVE_EVERY", "50")))
    p.add_argument("--log-every", type=int, default=int(env("LOG_EVERY", "1")))
    p.add_argument("--seed", type=int, default=int(env("SEED", "0")))
    p.add_argument("--resume", default=env("RESUME_FROM", "auto"))
    return p.parse_args(argv)


def resolve(path: str) -> Path:
    """A path as the container sees it. On a bare host (the console's ``runtime=process``), the
    instance's directory (the working directory) stands in for the container's root: /pfs and the
    mounts are links there."""
    p = Path(path)
    if p.exists() or not p.is_absolute():
        return p
    inside = Path.cwd() / path.lstrip("/")
    return inside if inside.exists() else p


def read_rows(dataset: Path) -> list[dict[str, str]]:
    files = (
        [dataset]
        if dataset.is_file()
        else sorted(f for f in dataset.rglob("*") if f.suffix in (".json", ".jsonl"))
    )
    rows: list[dict[str, str]] = []
    for f in files:
        text = f.read_text(encoding="utf-8")
        if f.suffix == ".jsonl":
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            items = data if isinstance(data, list) else []
        rows += [r for r in items if isinstance(r, dict) and r.get("output")]
    if not rows:
        raise SystemExit(f"no instruction rows (JSON/JSONL with 'output') under {dataset}")
    return rows


def encode(tokenizer: Any, row: dict[str, str], seq_len: int) -> tuple[list[int], list[int]]:
    """Token ids and labels; the prompt's tokens are not learned (label -100)."""
    prompt = PROMPT.format(instruction=row.get("instruction", ""), input=row.get("input", ""))
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    a_ids = tokenizer(str(row["output"]), add_special_tokens=False)["input_ids"]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids = (bos + p_ids + a_ids + eos)[:seq_len]
    labels = ([-100] * (len(bos) + len(p_ids)) + a_ids + eos)[:seq_len]
    return ids, labels


def batches(examples: list[tuple[list[int], list[int]]], batch_size: int, pad: int, seed: int):  # noqa: ANN201
    """Endless padded batches over this rank's examples, reshuffled every epoch."""
    epoch = 0
    while True:
        order = list(range(len(examples)))
        random.Random(seed + epoch).shuffle(order)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            chunk = [examples[j] for j in order[i : i + batch_size]]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            labels = torch.full((len(chunk), width), -100, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for k, (x, y) in enumerate(chunk):
                ids[k, : len(x)] = torch.tensor(x)
                labels[k, : len(y)] = torch.tensor(y)
                mask[k, : len(x)] = 1
            yield ids, labels, mask
        epoch += 1


def latest_checkpoint(run_dir: Path) -> Path | None:
    steps = []
    for d in run_dir.glob("step-*"):
        if d.is_dir() and d.name[5:].isdigit() and (d / "trainer_state.json").is_file():
            steps.append((int(d.name[5:]), d))
    return max(steps)[1] if steps else None


def save_checkpoint(model: Any, optimizer: Any, step: int, loss: float, target: Path) -> None:
    """Write beside the target, then rename: a checkpoint is complete or absent."""
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "loss": loss}))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


@dataclass
class Run:
    """Where this process runs and what it writes: one per rank."""

    args: argparse.Namespace
    world: int
    rank: int
    local_rank: int
    device: torch.device
    output: Path
    run_dir: Path
    shown: str  # the output path as the user sees it (/pfs), for the console's lines
    started: float = field(default_factory=time.monotonic)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def shown_checkpoint(self, step: int) -> str:
        return f"{self.shown}/checkpoints/{self.args.run_name}/step-{step}"


def start_run(args: argparse.Namespace) -> Run:
    """This rank's device and process group (NCCL on GPUs, gloo on the CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(args.seed)
    output = resolve(args.output)
    return Run(
        args=args,
        world=world,
        rank=rank,
        local_rank=local_rank,
        device=torch.device("cuda", local_rank) if cuda else torch.device("cpu"),
        output=output,
        run_dir=output / "checkpoints" / args.run_name,
        shown=args.output.rstrip("/") or "/",
    )


def load_model(run: Run, model_dir: Path) -> tuple[Any, Any]:
    """The tokenizer and the base model wrapped with LoRA adapters (only those are trained)."""
    args = run.args
    say(run.rank, f"loading {model_dir} on {run.world} process(es), {run.device.type}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dtype = torch.bfloat16 if run.cuda and torch.cuda.is_bf16_supported() else torch.float32
    # Transformers 4.56 renamed torch_dtype to dtype (the images ship 4.x, the CPU test 5.x).
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    base = AutoModelForCausalLM.from_pretrained(model_dir, **{key: dtype}).to(run.device)
    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        lora_dropout=0.0,
        target_modules=[t.strip() for t in args.lora_targets.split(",") if t.strip()],
        task_type="CAUSAL_LM",
    )
    return tokenizer, get_peft_model(base, lora)


def resume_step(run: Run, model: Any, optimizer: Any) -> int | None:
    """Load the checkpoint ``--resume`` names (``auto``: the run's latest); its step, or None."""
    args = run.args
    if args.resume in ("", "none"):
        return None
    resume = latest_checkpoint(run.run_dir) if args.resume == "auto" else resolve(args.resume)
    if resume is None:
        return None
    if not (resume / "trainer_state.json").is_file():
        raise SystemExit(f"RESUME_FROM={args.resume}: not a checkpoint directory")
    set_peft_model_state_dict(model, load_file(resume / "adapter_model.safetensors"))
    optimizer.load_state_dict(torch.load(resume / "optimizer.pt", map_location=run.device))
    step = int(json.loads((resume / "trainer_state.json").read_text())["step"])
    say(run.rank, f"resumed from {resume} at step {step}")
    return step


@dataclass
class Progress:
    """The loop's running figures: step, last loss, recent step times."""

    step: int
    loss: float = math.nan
    step_times: list[float] = field(default_factory=list)

    def per_step(self) -> float:
        recent = self.step_times[-20:]
        return sum(recent) / len(recent)


def train_step(run: Run, ddp: Any, optimizer: Any, batch: Any) -> tuple[float, float]:
    """One optimiser step; the loss averaged over ranks and the tokens seen by all of them."""
    ids, labels, mask = (t.to(run.device) for t in batch)
    out = ddp(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    figures = torch.tensor(
        [out.loss.detach().float().item(), float(mask.sum().item())], device=run.device
    )
    if run.world > 1:
        dist.all_reduce(figures)
    return figures[0].item() / run.world, figures[1].item()


def report_step(run: Run, progress: Progress, tokens: float, seconds: float) -> None:
    """The progress line (every ``--log-every`` steps and the last one)."""
    args = run.args
    elapsed = time.monotonic() - run.started
    eta = (args.max_steps - progress.step) * progress.per_step()
    if args.time_limit:
        eta = min(eta, max(0.0, args.time_limit - SAVE_MARGIN_S - elapsed))
    if progress.step % args.log_every == 0 or progress.step == args.max_steps:
        emit(
            run.rank,
            "progress",
            step=progress.step,
            max_steps=args.max_steps,
            loss=round(progress.loss, 4),
            lr=args.lr,
            tokens_per_s=round(tokens / seconds, 1) if seconds else None,
            eta_s=round(eta, 1),
            elapsed_s=round(elapsed, 1),
        )


def train(run: Run, model: Any, optimizer: Any, stream: Any, progress: Progress) -> str:
    """Train until ``--max-steps`` or the time limit (less the time to save); why it stopped."""
    args = run.args
    ddp = (
        torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[run.local_rank] if run.cuda else None
        )
        if run.world > 1
        else model
    )
    model.train()
    while progress.step < args.max_steps:
        t0 = time.monotonic()
        progress.loss, tokens = train_step(run, ddp, optimizer, next(stream))
        progress.step += 1
        seconds = time.monotonic() - t0
        progress.step_times.append(seconds)
        report_step(run, progress, tokens, seconds)
        step = progress.step
        if args.save_every and step % args.save_every == 0 and step < args.max_steps:
            if run.rank == 0:
                save_checkpoint(model, optimizer, step, progress.loss, run.run_dir / f"step-{step}")
            emit(run.rank, "checkpoint", step=step, path=run.shown_checkpoint(step))
        elapsed = time.monotonic() - run.started
        if args.time_limit and elapsed + 2 * progress.per_step() + SAVE_MARGIN_S > args.time_limit:
            return "time_limit"
    return "max_steps"


def finish(run: Run, model: Any, optimizer: Any, progress: Progress, reason: str) -> None:
    """The last checkpoint and the adapter (rank 0), then the done line."""
    step, name = progress.step, run.args.run_name
    if run.rank == 0:
        save_checkpoint(model, optimizer, step, progress.loss, run.run_dir / f"step-{step}")
        emit(run.rank, "checkpoint", step=step, path=run.shown_checkpoint(step))
        adapter = run.output / "adapters" / name
        adapter.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(adapter)
    if run.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    emit(
        run.rank,
        "done",
        step=step,
        loss=round(progress.loss, 4),
        adapter=f"{run.shown}/adapters/{name}",
        reason=reason,
        elapsed_s=round(time.monotonic() - run.started, 1),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = start_run(args)
    tokenizer, model = load_model(run, resolve(args.model))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    resumed = resume_step(run, model, optimizer)
    progress = Progress(step=resumed or 0)

    rows = read_rows(resolve(args.dataset))
    mine = [encode(tokenizer, r, args.seq_len) for r in rows[run.rank :: run.world]] or [
        encode(tokenizer, rows[0], args.seq_len)
    ]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stream = batches(mine, min(args.batch_size, len(mine)), pad, args.seed + progress.step)
    emit(
        run.rank,
        "start",
        run=args.run_name,
        world_size=run.world,
        device=run.device.type,
        model=str(args.model),
        examples=len(rows),
        trainable_params=trainable,
        total_params=total,
        max_steps=args.max_steps,
        resumed_from=resumed,
    )
    reason = train(run, model, optimizer, stream, progress)
    finish(run, model, optimizer, progress, reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
