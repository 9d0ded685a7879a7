"""The catalogue's own English prose, for translation: image summaries and licence summaries.

They are a small fixed set shipped in marketplace/data/images.yaml and licenses.yaml; listing them
here puts them in the message catalogue (makemessages), and the ``catalogue_text`` template filter
shows each in the reader's language. tests/marketplace/test_catalogue_translations.py fails when a
shipped text has no Chinese, so a change to the data cannot silently bring English back into the
Chinese UI. Text an operator writes in the admin is shown as written.
"""

from __future__ import annotations

from django.utils.translation import gettext_noop

SHIPPED_TEXTS = (
    gettext_noop(
        "Meta's Llama 2 Community License: use, reproduction and modification are allowed under the Acceptable Use Policy; products with more than 700 million monthly active users need a separate license from Meta; the license and its notice must travel with any redistribution."
    ),
    gettext_noop(
        'Meta Llama 3 Community License: use under the Acceptable Use Policy, "Built with Meta Llama 3" attribution on redistributed products, and a separate license from Meta above 700 million monthly active users.'
    ),
    gettext_noop(
        'Llama 3.1 Community License: use under the Acceptable Use Policy, "Built with Llama" attribution, and a separate license from Meta above 700 million monthly active users.'
    ),
    gettext_noop(
        'Llama 3.2 Community License: use under the Acceptable Use Policy, "Built with Llama" attribution, and a separate license from Meta above 700 million monthly active users.'
    ),
    gettext_noop(
        'Llama 3.3 Community License: use under the Acceptable Use Policy, "Built with Llama" attribution, and a separate license from Meta above 700 million monthly active users.'
    ),
    gettext_noop(
        "Google's Gemma Terms of Use: use, modification and distribution are allowed subject to the Gemma Prohibited Use Policy, which must be passed on to anyone you distribute to."
    ),
    gettext_noop(
        "Meta's DINOv3 License: research and commercial use under Meta's terms, with the license passed on with redistributed materials."
    ),
    gettext_noop(
        "Google's Health AI Developer Foundations terms: not for clinical use without further validation; use subject to the prohibited-use policy."
    ),
    gettext_noop(
        "The Winoground dataset's license agreement: evaluation use only; do not train on it."
    ),
    gettext_noop(
        "The official PyTorch development images (CUDA toolkit, cuDNN, compilers), ready for single-node training, fine-tuning and notebooks."
    ),
    gettext_noop(
        "Microsoft DeepSpeed (ZeRO stages 1-3, offload, pipeline parallelism) on the official PyTorch images, with its CUDA ops pre-built so the first deepspeed launch does not spend minutes compiling."
    ),
    gettext_noop(
        "NVIDIA Megatron-LM / Megatron-Core for tensor, pipeline and sequence parallel pre-training, on the NGC PyTorch containers Megatron-LM's README recommends (Apex, Transformer Engine, NCCL tuned for InfiniBand). The repository is checked out at /workspace/Megatron-LM."
    ),
    gettext_noop(
        "HPC-AI Tech's Colossal-AI (Gemini heterogeneous memory, hybrid parallel plugins, Colossal-LLaMA recipes), with its CUDA kernels built ahead of time."
    ),
    gettext_noop(
        "What the one-click AI applications run on: PyTorch with vLLM, Transformers, Diffusers and PEFT, plus the console's app servers (/opt/apps) and LoRA trainer (/opt/recipes); JupyterLab and TensorBoard as in every image."
    ),
)
