"""Which environment variables a customer may set on an instance, and which the platform owns.
No Django: the order service (``slices.services.instances``) and the node driver
(``slices.drivers``) both read it.

An instance's environment has two sources. The customer's ``env`` of an order is checked here:
names are matched whole (``fullmatch``: ``"A\\n"`` is not a name), values are one line of text,
and the names the platform owns are refused, all of them named in the message. The console's
own ``platform_env`` (a recipe launch: ``RECIPE``, ``RUN_NAME``, ``CHECKPOINT_RUN``, the run's
parameters) may use the platform's names and wins over the customer's. What the console computes
for every instance (``InstanceSpec.job_env``: ranks, the master, ``PFS``, NCCL) and what the driver
derives from the allocation (``CUDA_VISIBLE_DEVICES``, ``NVIDIA_VISIBLE_DEVICES``) win over both.

Nothing of it is ever evaluated by a host's shell: the ssh driver hands the environment to the
runtime as data (docker's ``--env-file``, enroot's ``--env=NAME=value`` arguments, ``env -i`` for
a bare process), which is why a value may not hold a line break (docker's env-file has no way to
write one) and why the names that steer a shell or the dynamic loader (``HOST_CONTROL``) are
refused from anyone, the console included: the entrypoint of an image (catalogue data) is run by
``sh -c`` inside the instance and must run as written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# A name: capitals, digits and _, not starting with a digit. Always used with ``fullmatch``.
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
MAX_VARS = 32
MAX_VALUE_CHARS = 4096
# What no runtime's environment format can carry (docker's env-file is one NAME=value a line, and
# its reader drops a trailing carriage return; C strings end at NUL).
_UNREPRESENTABLE = re.compile(r"[\x00\r\n]")

# Names that change how a shell or the dynamic loader runs a program, or how enroot (a bash
# script) behaves: never in an instance's environment, whoever sets them.
HOST_CONTROL = frozenset(
    {
        "PATH",
        "ENV",
        "BASH_ENV",
        "BASHOPTS",
        "SHELLOPTS",
        "IFS",
        "PS4",
        "CDPATH",
        "GLOBIGNORE",
        "PROMPT_COMMAND",
        "GCONV_PATH",
        "GLIBC_TUNABLES",
    }
)
HOST_CONTROL_PREFIXES = ("LD_", "ENROOT_")

# Names the console sets on every instance (``InstanceSpec.job_env``), on a recipe run
# (``slices.services.recipes.launch_recipe``) or for checkpoints (``storage.checkpoint_env``).
PLATFORM_NAMES = frozenset(
    {
        "INSTANCE_ID",
        "INSTANCE_NAME",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "NNODES",
        "WORLD_SIZE",
        "NPROC_PER_NODE",
        "PFS",
        "RESUME_FROM",
        "RUN_NAME",
        "TIME_LIMIT_S",
        "MODEL_DIR",
        "DATASET_DIR",
        # JupyterLab's token (the instance's secret) and base URL behind the console's proxy.
        "JUPYTER_TOKEN",
        "JUPYTER_BASE_URL",
    }
)
# The devices (driver), the fabric (console), checkpoints, the console's own switches, the
# simulated fleet's knobs and recipes.
PLATFORM_PREFIXES = ("CUDA_", "NVIDIA_", "NCCL_", "CHECKPOINT_", "GPC_", "SIM_", "RECIPE")
# Platform names a customer opts into on purpose (README "Live GPU telemetry").
CUSTOMER_OPTIONS = frozenset({"GPC_RELEASE_WHEN_IDLE"})


def is_name(name: object) -> bool:
    """A whole environment variable name (no trailing newline, no ``=``, ASCII capitals)."""
    return isinstance(name, str) and ENV_NAME.fullmatch(name) is not None


def is_host_control(name: str) -> bool:
    return name in HOST_CONTROL or name.startswith(HOST_CONTROL_PREFIXES)


def is_platform_name(name: str) -> bool:
    """Set by the platform, so refused in a customer's order (``CUSTOMER_OPTIONS`` aside)."""
    if name in CUSTOMER_OPTIONS:
        return False
    return is_host_control(name) or name in PLATFORM_NAMES or name.startswith(PLATFORM_PREFIXES)


def refused_customer_names(names: Iterable[str]) -> list[str]:
    """The names of a customer's order the platform owns, sorted (empty: none)."""
    return sorted({n for n in names if is_platform_name(n)})


def refused_platform_names(names: Iterable[str]) -> list[str]:
    """The names no one may set, the console included, sorted (empty: none)."""
    return sorted({n for n in names if is_host_control(n)})


def value_problem(value: str) -> str:
    """Why ``value`` cannot be an environment value ("" when it can): too long, or a character
    no runtime's environment format carries (NUL, a line break: "unrepresentable")."""
    if len(value) > MAX_VALUE_CHARS:
        return "too_long"
    if _UNREPRESENTABLE.search(value):
        return "unrepresentable"
    return ""


def merged(customer: Mapping[str, str], platform: Mapping[str, str]) -> dict[str, str]:
    """The instance's stored environment: the customer's, then the platform's over it."""
    return {**customer, **platform}
