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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    started = time.monotonic()
    torch.manual_seed(args.seed)

    model_dir, data_dir = resolve(args.model), resolve(args.dataset)
    output = resolve(args.output)
    shown = args.output.rstrip("/") or "/"  # paths are reported as the user sees them (/pfs/...)
    run_dir = output / "checkpoints" / args.run_name
    say(rank, f"loading {model_dir} on {world} process(es), {device.type}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    # Transformers 4.56 renamed torch_dtype to dtype (the images ship 4.x, the CPU test 5.x).
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    base = AutoModelForCausalLM.from_pretrained(model_dir, **{key: dtype}).to(device)
    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        lora_dropout=0.0,
        target_modules=[t.strip() for t in args.lora_targets.split(",") if t.strip()],
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)

    step = 0
    resume = None
    if args.resume not in ("", "none"):
        resume = latest_checkpoint(run_dir) if args.resume == "auto" else resolve(args.resume)
        if resume is not None and not (resume / "trainer_state.json").is_file():
            raise SystemExit(f"RESUME_FROM={args.resume}: not a checkpoint directory")
    if resume is not None:
        set_peft_model_state_dict(model, load_file(resume / "adapter_model.safetensors"))
        optimizer.load_state_dict(torch.load(resume / "optimizer.pt", map_location=device))
        step = int(json.loads((resume / "trainer_state.json").read_text())["step"])
        say(rank, f"resumed from {resume} at step {step}")

    rows = read_rows(data_dir)
    mine = [encode(tokenizer, r, args.seq_len) for r in rows[rank::world]] or [
        encode(tokenizer, rows[0], args.seq_len)
    ]
    stream = batches(mine, min(args.batch_size, len(mine)), pad, args.seed + step)
    ddp = (
        torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
        if world > 1
        else model
    )
    emit(
        rank,
        "start",
        run=args.run_name,
        world_size=world,
        device=device.type,
        model=str(args.model),
        examples=len(rows),
        trainable_params=trainable,
        total_params=total,
        max_steps=args.max_steps,
        resumed_from=step if resume is not None else None,
    )

    model.train()
    loss_value = math.nan
    step_times: list[float] = []
    reason = "max_steps"
    while step < args.max_steps:
        t0 = time.monotonic()
        ids, labels, mask = (t.to(device) for t in next(stream))
        out = ddp(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        figures = torch.tensor(
            [out.loss.detach().float().item(), float(mask.sum().item())], device=device
        )
        if world > 1:
            dist.all_reduce(figures)
        step += 1
        loss_value = figures[0].item() / world
        seconds = time.monotonic() - t0
        step_times.append(seconds)
        per_step = sum(step_times[-20:]) / len(step_times[-20:])
        elapsed = time.monotonic() - started
        eta = (args.max_steps - step) * per_step
        if args.time_limit:
            eta = min(eta, max(0.0, args.time_limit - SAVE_MARGIN_S - elapsed))
        if step % args.log_every == 0 or step == args.max_steps:
            emit(
                rank,
                "progress",
                step=step,
                max_steps=args.max_steps,
                loss=round(loss_value, 4),
                lr=args.lr,
                tokens_per_s=round(figures[1].item() / seconds, 1) if seconds else None,
                eta_s=round(eta, 1),
                elapsed_s=round(elapsed, 1),
            )
        if args.save_every and step % args.save_every == 0 and step < args.max_steps:
            if rank == 0:
                save_checkpoint(model, optimizer, step, loss_value, run_dir / f"step-{step}")
            emit(
                rank,
                "checkpoint",
                step=step,
                path=f"{shown}/checkpoints/{args.run_name}/step-{step}",
            )
        if args.time_limit and elapsed + 2 * per_step + SAVE_MARGIN_S > args.time_limit:
            reason = "time_limit"
            break

    adapter = output / "adapters" / args.run_name
    if rank == 0:
        save_checkpoint(model, optimizer, step, loss_value, run_dir / f"step-{step}")
        emit(rank, "checkpoint", step=step, path=f"{shown}/checkpoints/{args.run_name}/step-{step}")
        adapter.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(adapter)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    emit(
        rank,
        "done",
        step=step,
        loss=round(loss_value, 4),
        adapter=f"{shown}/adapters/{args.run_name}",
        reason=reason,
        elapsed_s=round(time.monotonic() - started, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
