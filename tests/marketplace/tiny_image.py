"""Make a tiny text-to-image diffusers pipeline with random weights, offline.

Run with the recipe environment's Python (torch, transformers and diffusers live there, not in the
console's environment; ``marketplace/apps/requirements.txt`` adds diffusers):

    var/recipe-venv/bin/python tests/marketplace/tiny_image.py <pipeline dir> [--xl]

It writes what ``save_pretrained`` writes for a real Stable Diffusion checkpoint (``model_index.json``
and one folder per component), so the image app's server loads it with the same
``DiffusionPipeline.from_pretrained`` call as the real SDXL directory. The sizes are tiny: building
takes a few seconds and a 64x64 image in 2 steps is generated in well under a second on the CPU.
``--xl`` builds a ``StableDiffusionXLPipeline`` instead (two text encoders and the UNet's size and
crop conditioning), the real app's architecture.

The tokenizer is a byte-level BPE with CLIP's conventions (``</w>`` word ends, start and end of
text tokens) whose vocabulary is just the 256 byte symbols in both forms and a few merges: any text,
Chinese included, tokenizes without unknown tokens. Nothing is downloaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# A few merges so the BPE model really merges something (the words the tests' prompts use).
MERGES = ["c a", "ca t</w>", "r e", "re d</w>", "a p", "ap p", "app l", "appl e</w>"]

START, END = "<|startoftext|>", "<|endoftext|>"

# Tiny sizes. The VAE has four blocks like the real one, so it scales by 8: a 64x64 image is an
# 8x8 latent, the UNet's ``sample_size`` (what the pipeline picks when no size is given).
HIDDEN = 32
LATENT_SIZE = 8


def byte_symbols() -> list[str]:
    """The 256 printable characters byte-level BPE uses for the 256 byte values (GPT-2's table)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += list(range(ord("®"), ord("ÿ") + 1))
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write_tokenizer(folder: Path) -> Any:
    """vocab.json and merges.txt in CLIP's format, loaded back as a ``CLIPTokenizer``."""
    from transformers import CLIPTokenizer

    symbols = byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols]
    for merge in MERGES:
        tokens.append(merge.replace(" ", ""))
    tokens += [START, END]
    vocab = {token: index for index, token in enumerate(dict.fromkeys(tokens))}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(MERGES) + "\n", encoding="utf-8"
    )
    # from_pretrained reads the two files whatever the constructor's argument names are (they
    # changed between transformers releases).
    return CLIPTokenizer.from_pretrained(
        str(folder),
        model_max_length=77,
        bos_token=START,
        eos_token=END,
        unk_token=END,
        pad_token=END,
    )


def text_config(tokenizer: Any, projection_dim: int = HIDDEN) -> Any:
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=projection_dim,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def scheduler(kind: Any) -> Any:
    """Stable Diffusion's noise schedule (what the real checkpoints' scheduler configs hold)."""
    return kind(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        steps_offset=1,
        timestep_spacing="leading",
    )


def tiny_vae() -> Any:
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        block_out_channels=[32, 32, 32, 32],
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=16,
        sample_size=LATENT_SIZE * 8,
    )


def build_sd(out: Path) -> None:
    """A ``StableDiffusionPipeline``: one CLIP text encoder, a cross-attention UNet."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    tokenizer = write_tokenizer(out / "_tokenizer_src")
    unet = UNet2DConditionModel(
        sample_size=LATENT_SIZE,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        cross_attention_dim=HIDDEN,
        attention_head_dim=8,
        norm_num_groups=16,
    )
    pipe = StableDiffusionPipeline(
        vae=tiny_vae(),
        text_encoder=CLIPTextModel(text_config(tokenizer)),
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler(EulerDiscreteScheduler),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out)


def build_xl(out: Path) -> None:
    """A ``StableDiffusionXLPipeline``: two text encoders (the second with a projection) whose
    hidden states are concatenated, and a UNet conditioned on the pooled text and the six
    size/crop numbers (``addition_embed_type="text_time"``), like SDXL base."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    tokenizer = write_tokenizer(out / "_tokenizer_src")
    time_dim = 8
    unet = UNet2DConditionModel(
        sample_size=LATENT_SIZE,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        cross_attention_dim=HIDDEN * 2,
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=time_dim,
        transformer_layers_per_block=(1, 1),
        projection_class_embeddings_input_dim=HIDDEN + 6 * time_dim,
        norm_num_groups=16,
    )
    pipe = StableDiffusionXLPipeline(
        vae=tiny_vae(),
        text_encoder=CLIPTextModel(text_config(tokenizer)),
        text_encoder_2=CLIPTextModelWithProjection(text_config(tokenizer)),
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=unet,
        scheduler=scheduler(EulerDiscreteScheduler),
        force_zeros_for_empty_prompt=True,
    )
    pipe.save_pretrained(out)


def main(argv: list[str]) -> None:
    import shutil

    import torch

    args = [a for a in argv if a != "--xl"]
    if len(args) != 1:
        raise SystemExit("usage: tiny_image.py <pipeline dir> [--xl]")
    out = Path(args[0])
    torch.manual_seed(0)
    (build_xl if "--xl" in argv else build_sd)(out)
    # The tokenizer's source files were only needed to build it; save_pretrained wrote its own.
    shutil.rmtree(out / "_tokenizer_src", ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
