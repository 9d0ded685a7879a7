"""The simulated fleet's web terminal: a shell that runs nothing anywhere (issue 19).

The embedded default never opens a shell on the console's own host. ``SimShell`` answers a few
commands with output made from the instance's spec (its GPUs, its mounts, its disks) and the same
workload model as the simulated telemetry, so ``nvidia-smi`` agrees with the charts. Its banner
says it is simulated. Line editing is what a terminal user expects at a prompt: printable text
echoed (UTF-8, wide characters erased as two columns), backspace, Enter, Ctrl-C, Ctrl-U, Ctrl-L,
Ctrl-D on an empty line; escape sequences (arrow keys, function keys) are ignored.

Thread-safe: ``send``, ``resize`` and ``close`` may be called while another thread waits in
``recv``. A program "running" in it (``python train.py``) is a list of timed lines that ``recv``
releases as their time comes; Ctrl-C interrupts it.
"""

from __future__ import annotations

import codecs
import shlex
import threading
import time
import unicodedata
from datetime import datetime

from slices.drivers.base import DriverError, InstanceSpec, NodeTarget
from slices.hostspec import host_spec
from slices.telemetry.workload import SimWorkload, profile_for, workload_for

# A bare host (no image): Ubuntu 22.04's Python, the host's CUDA toolkit, no PyTorch.
BARE_PYTHON = "3.10"
# When the catalogue gives the GPU model no host figures.
DEFAULT_DRIVER, DEFAULT_CUDA = "550.54.15", "12.4"

BANNER = (
    "\x1b[1;33m[simulated]\x1b[0m This is a simulated shell on the console's digital twin: "
    "no command runs anywhere.\r\n"
    "\x1b[1;33m[模拟]\x1b[0m 这是数字孪生上的模拟终端：命令不会在任何机器上运行。\r\n"
    "Type \x1b[1mhelp\x1b[0m for the commands it knows. 输入 help 查看支持的命令。\r\n\r\n"
)
HELP = (
    "Simulated shell: the commands it knows\r\n"
    "  nvidia-smi [-L]    the instance's GPUs\r\n"
    "  ls [/pfs]          files (the parallel file system under /pfs)\r\n"
    "  df -h              file systems\r\n"
    "  nproc, free -h     the CPUs and memory that come with the GPUs\r\n"
    "  python --version, nvcc --version   the image's versions\r\n"
    "  python train.py    a short training run (Ctrl-C stops it)\r\n"
    "  echo, pwd, cd, hostname, whoami, uname -a, stty size, env, clear, help, exit\r\n"
)
NOT_FOUND = "bash: {cmd}: command not found (simulated shell: type help)\r\n"
MAX_LINE_CHARS = 4096
TRAIN_STEPS = 20


def _width(char: str) -> int:
    """Columns a character takes in a terminal (CJK and other wide characters: two)."""
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


class SimShell:
    """One simulated terminal of one instance's node."""

    simulated = True

    def __init__(
        self,
        spec: InstanceSpec,
        node: NodeTarget,
        *,
        gpu_model: str = "",
        cols: int = 80,
        rows: int = 24,
        time_scale: float = 1.0,
    ) -> None:
        self.spec = spec
        self.node = node
        self.gpu_model = gpu_model
        self.cols, self.rows = cols, rows
        self.time_scale = max(0.0, time_scale)
        self._cond = threading.Condition()
        self._out = bytearray()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._line: list[str] = []
        self._escape = ""  # an escape sequence being skipped
        self._job: list[tuple[float, str]] = []  # (due, text) of the running program
        self._ended = False
        self._closed = False
        self.cwd = "/root"
        self._emit(BANNER + self._prompt())

    # -- the Shell protocol ---------------------------------------------------------------
    def send(self, data: bytes) -> None:
        with self._cond:
            if self._closed or self._ended:
                raise DriverError("terminal_closed", "the simulated shell has ended")
            for char in self._decoder.decode(data):
                self._key(char)
            self._cond.notify_all()

    def recv(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                self._release_due()
                if self._out:
                    data = bytes(self._out)
                    self._out.clear()
                    return data
                if self._ended or self._closed:
                    return None
                now = time.monotonic()
                if now >= deadline:
                    return b""
                wait = deadline - now
                if self._job:
                    wait = min(wait, max(0.0, self._job[0][0] - now))
                self._cond.wait(wait)

    def resize(self, cols: int, rows: int) -> None:
        with self._cond:
            self.cols, self.rows = cols, rows

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- input ----------------------------------------------------------------------------
    def _emit(self, text: str) -> None:
        self._out += text.encode("utf-8")

    def _prompt(self) -> str:
        where = "~" + self.cwd[5:] if self.cwd.startswith("/root") else self.cwd
        return f"\x1b[1;32mroot@{self.node.hostname}\x1b[0m:\x1b[1;34m{where}\x1b[0m# "

    def _key(self, char: str) -> None:
        if self._escape:
            self._escape += char
            # CSI (ESC [ ... final byte) and SS3 (ESC O x) sequences end with a letter or ~.
            n = len(self._escape)
            if (n == 2 and char not in "[O") or (n > 2 and "@" <= char <= "~") or n > 16:
                self._escape = ""
            return
        if char == "\x1b":
            self._escape = char
            return
        if char == "\x03":  # Ctrl-C
            if self._job:
                self._job = []
                self._emit(
                    "^C\r\nTraceback (most recent call last):\r\n"
                    '  File "/root/train.py", line 88, in <module>\r\n'
                    "KeyboardInterrupt\r\n" + self._prompt()
                )
            else:
                self._line = []
                self._emit("^C\r\n" + self._prompt())
            return
        if self._job:
            return  # a running program reads nothing else
        if char in "\r\n":
            line = "".join(self._line)
            self._line = []
            self._emit("\r\n")
            self._run(line)
            if not self._ended and not self._job:
                self._emit(self._prompt())
        elif char in "\x7f\x08":  # backspace
            if self._line:
                gone = self._line.pop()
                cols = _width(gone)
                self._emit("\b" * cols + " " * cols + "\b" * cols)
        elif char == "\x15":  # Ctrl-U
            cols = sum(_width(c) for c in self._line)
            self._line = []
            self._emit("\b" * cols + " " * cols + "\b" * cols)
        elif char == "\x0c":  # Ctrl-L
            self._emit("\x1b[H\x1b[2J" + self._prompt() + "".join(self._line))
        elif char == "\x04":  # Ctrl-D
            if not self._line:
                self._emit("logout\r\n")
                self._ended = True
        elif len(self._line) < MAX_LINE_CHARS and (
            char == "\t" or unicodedata.category(char) not in ("Cc", "Cf", "Cs")
        ):
            char = " " if char == "\t" else char
            self._line.append(char)
            self._emit(char)

    # -- commands -------------------------------------------------------------------------
    def _run(self, line: str) -> None:
        try:
            words = shlex.split(line)
        except ValueError:
            self._emit("bash: unexpected end of line (simulated shell)\r\n")
            return
        if not words:
            return
        cmd, args = words[0], words[1:]
        handler = {
            "help": self._help,
            "nvidia-smi": self._nvidia_smi,
            "ls": self._ls,
            "df": self._df,
            "python": self._python,
            "python3": self._python,
            "nvcc": self._nvcc,
            "nproc": self._nproc,
            "free": self._free,
            "echo": self._echo,
            "pwd": self._pwd,
            "cd": self._cd,
            "hostname": self._hostname,
            "whoami": self._whoami,
            "uname": self._uname,
            "stty": self._stty,
            "env": self._env,
            "clear": self._clear,
            "exit": self._exit,
            "logout": self._exit,
        }.get(cmd)
        if handler is None:
            self._emit(NOT_FOUND.format(cmd=cmd))
            return
        handler(args)

    def _help(self, args: list[str]) -> None:
        self._emit(HELP)

    def _echo(self, args: list[str]) -> None:
        self._emit(" ".join(args) + "\r\n")

    def _pwd(self, args: list[str]) -> None:
        self._emit(self.cwd + "\r\n")

    def _cd(self, args: list[str]) -> None:
        target = args[0] if args else "/root"
        known = {"/", "/root", "/pfs", "/tmp", *self._mount_targets()}  # noqa: S108 - simulated
        path = target if target.startswith("/") else f"{self.cwd.rstrip('/')}/{target}"
        path = "/" + "/".join(p for p in path.split("/") if p and p != ".")
        if path not in known and not self._mounted_below(path):
            self._emit(f"bash: cd: {target}: No such file or directory\r\n")
            return
        self.cwd = path

    def _hostname(self, args: list[str]) -> None:
        self._emit(self.node.hostname + "\r\n")

    def _whoami(self, args: list[str]) -> None:
        self._emit("root\r\n")

    def _uname(self, args: list[str]) -> None:
        if args[:1] == ["-a"]:
            self._emit(
                f"Linux {self.node.hostname} 5.15.0-105-generic #115-Ubuntu SMP x86_64 GNU/Linux\r\n"
            )
        else:
            self._emit("Linux\r\n")

    def _stty(self, args: list[str]) -> None:
        if args[:1] == ["size"]:
            self._emit(f"{self.rows} {self.cols}\r\n")
        else:
            self._emit("stty: only 'stty size' is simulated\r\n")

    def _env(self, args: list[str]) -> None:
        env = self.spec.job_env(self.node)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(self.node.gpus)))
        self._emit("".join(f"{k}={v}\r\n" for k, v in sorted(env.items())))

    def _clear(self, args: list[str]) -> None:
        self._emit("\x1b[H\x1b[2J")

    def _exit(self, args: list[str]) -> None:
        self._emit("logout\r\n")
        self._ended = True

    def _mount_targets(self) -> list[str]:
        return [m.target for m in self.spec.mounts] + [d.target for d in self.spec.disks]

    def _mounted_below(self, path: str) -> list[str]:
        """The names directly under ``path`` that lead to a mount point (``/models`` ->
        ``["llama-7b"]`` for ``/models/llama-7b``): the directories the mounts create."""
        prefix = path.rstrip("/") + "/"
        return sorted(
            {t[len(prefix) :].split("/")[0] for t in self._mount_targets() if t.startswith(prefix)}
        )

    def _ls(self, args: list[str]) -> None:
        paths = [a for a in args if not a.startswith("-")] or [self.cwd]
        for path in paths:
            path = path.rstrip("/") or "/"
            if path in ("/pfs", "/pfs/"):
                names = ["adapters", "checkpoints", "datasets", "runs"]
            elif path == "/root":
                names = ["README.md", "train.py"]
            elif path == "/":
                names = sorted(
                    {"bin", "dev", "etc", "home", "pfs", "proc", "root", "tmp", "usr", "var"}
                    | {m.strip("/").split("/")[0] for m in self._mount_targets()}
                )
            elif path in self._mount_targets():
                names = ["config.json", "README.md"]
            elif self._mounted_below(path):
                # /models holds the model mounts (/models/<name>), as df -h lists them.
                names = self._mounted_below(path)
            else:
                self._emit(f"ls: cannot access '{path}': No such file or directory\r\n")
                continue
            if len(paths) > 1:
                self._emit(f"{path}:\r\n")
            self._emit("  ".join(f"\x1b[1;34m{n}\x1b[0m" if "." not in n else n for n in names))
            self._emit("\r\n")

    def _df(self, args: list[str]) -> None:
        rows = [("Filesystem", "Size", "Used", "Avail", "Use%", "Mounted on")]
        disk = self.spec.system_disk_gb or 50
        used = max(1, disk // 7)
        rows.append(
            ("overlay", f"{disk}G", f"{used}G", f"{disk - used}G", f"{used * 100 // disk}%", "/")
        )
        rows.append(("tmpfs", "64M", "0", "64M", "0%", "/dev"))
        rows.append(("shm", "64G", "0", "64G", "0%", "/dev/shm"))  # noqa: S108 - simulated
        rows.append(("pfs:/export/users", "200G", "37G", "164G", "19%", "/pfs"))
        for d in self.spec.disks:
            rows.append(
                (
                    f"/dev/rbd/{d.disk_id[:8]}",
                    f"{d.size_gb}G",
                    "1.2G",
                    f"{d.size_gb - 2}G",
                    "1%",
                    d.target,
                )
            )
        for m in self.spec.mounts:
            rows.append(("pfs:/export/catalogue", "512T", "301T", "211T", "59%", m.target))
        widths = [max(len(r[i]) for r in rows) for i in range(6)]
        for r in rows:
            cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, 5)] + [r[5]]
            self._emit(" ".join(cells) + "\r\n")

    # -- nvidia-smi -------------------------------------------------------------------------
    def _workload(self) -> SimWorkload:
        return SimWorkload(
            instance_id=self.spec.instance_id,
            host=self.node.hostname,
            rank=self.node.rank,
            gpus=self.node.gpus,
            workload=workload_for(self.spec.env),
            gpu_model=self.gpu_model or "H800",
            started_at=time.time() - 600,
            failing_gpu=self.spec.env.get("SIM_FAILING_GPU", "0"),
        )

    def _nvidia_smi(self, args: list[str]) -> None:
        if not self.node.gpus:
            self._emit("No devices were found\r\n")
            return
        now = time.time()
        workload = self._workload()
        gpus = [workload.gpu(host_index, now) for host_index in self.node.gpus]
        if args[:1] == ["-L"]:
            for i, g in enumerate(gpus):
                self._emit(
                    f"GPU {i}: {profile_for(self.gpu_model).name} (UUID: {g.get('uuid', '')})\r\n"
                )
            return
        bar = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
        driver, cuda = self._driver()
        lines = [
            datetime.now().strftime("%a %b %d %H:%M:%S %Y"),
            "+" + "-" * 89 + "+",
            f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}|",
            "|" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "|",
            "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
            "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
            "|" + " " * 41 + "|" + " " * 24 + "|               MIG M. |",
            "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
        ]
        name = profile_for(self.gpu_model).name[:26]
        for i, g in enumerate(gpus):
            bus = "00000000:%02X:00.0" % (0x18 + self.node.gpus[i])
            if g.get("state") == "lost":
                lines.append(f"|{i:4d}  {'ERR!':<26}{'On':>7}  |   {bus} Off |{'ERR!':>21} |")
                lines.append(
                    f"|{'ERR!  ERR!  ERR!':<29}{'ERR! / ERR!':>12}|{'GPU is lost':>23} |{'ERR!':>8}{'Default':>13} |"
                )
            else:
                perf = "P0" if g["util_gpu"] > 5 else "P8"
                power = f"{g['power_w']:.0f}W / {g['power_limit_w']:.0f}W"
                memory = f"{g['mem_used_mib']:.0f}MiB / {g['mem_total_mib']:.0f}MiB"
                util = f"{g['util_gpu']}%"
                lines.append(
                    f"|{i:4d}  {name:<26}{'On':>7}  |   {bus} Off |{g['ecc_uncorrected']:>21} |"
                )
                lines.append(
                    f"| N/A  {g['temp_c']:>3}C    {perf:<3}{power:>23} |{memory:>23} |{util:>8}{'Default':>13} |"
                )
            lines.append("|" + " " * 41 + "|" + " " * 24 + "|" + f"{'Disabled':>21} |")
            lines.append(bar)
        lines += [
            "",
            "+" + "-" * 89 + "+",
            "| Processes:" + " " * 78 + "|",
            "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|" + "=" * 89 + "|",
        ]
        busy = [
            (i, g) for i, g in enumerate(gpus) if g.get("state") != "lost" and g["util_gpu"] > 5
        ]
        if not busy:
            lines.append("|  No running processes found" + " " * 61 + "|")
        for i, g in busy:
            used = f"{g['mem_used_mib'] - 500:.0f}MiB"
            lines.append(
                f"|{i:5d}   N/A  N/A {4100 + 17 * i:>10}      C   {'python':<40}{used:>11} |"
            )
        lines.append("+" + "-" * 89 + "+")
        self._emit("\r\n".join(lines) + "\r\n")

    # -- python train.py ----------------------------------------------------------------------
    # -- the host's and the image's versions ---------------------------------------------------
    def _software(self) -> dict[str, str]:
        return dict(self.spec.software)

    def _driver(self) -> tuple[str, str]:
        """The host's NVIDIA driver and the highest CUDA it runs (the catalogue's figures)."""
        spec = host_spec(self.gpu_model)
        return (spec.driver, spec.cuda) if spec else (DEFAULT_DRIVER, DEFAULT_CUDA)

    def _nvcc(self, args: list[str]) -> None:
        # The image's CUDA toolkit; a bare host has the driver's.
        cuda = self._software().get("cuda") or self._driver()[1]
        self._emit(
            "nvcc: NVIDIA (R) Cuda compiler driver\r\n"
            f"Cuda compilation tools, release {cuda}, V{cuda}\r\n"
        )

    def _nproc(self, args: list[str]) -> None:
        spec = host_spec(self.gpu_model)
        cpus = spec.vcpus(len(self.node.gpus)) if spec else max(1, 8 * len(self.node.gpus))
        self._emit(f"{cpus}\r\n")

    def _free(self, args: list[str]) -> None:
        spec = host_spec(self.gpu_model)
        gib = spec.memory_gib(len(self.node.gpus)) if spec else 32
        used = max(1, gib // 20)
        self._emit(
            "               total        used        free      shared  buff/cache   available\r\n"
            f"Mem:      {gib:>8}Gi {used:>10}Gi {gib - used:>10}Gi {0:>10}Gi {0:>10}Gi "
            f"{gib - used:>10}Gi\r\n"
            f"Swap:     {0:>8}B {0:>10}B {0:>10}B\r\n"
        )

    def _python(self, args: list[str]) -> None:
        software = self._software()
        version = software.get("python") or BARE_PYTHON
        script = args[0] if args else ""
        if script in ("--version", "-V"):
            self._emit(f"Python {version}\r\n")
            return
        if script == "-c":
            self._python_c(args[1] if len(args) > 1 else "", software)
            return
        if not script:
            self._emit(
                f"Python {version} is simulated here without a prompt: run python train.py\r\n"
            )
            return
        if script not in ("train.py", "/root/train.py") and not script.endswith("/train.py"):
            self._emit(
                f"python: can't open file '{self.cwd}/{script}': [Errno 2] No such file or directory\r\n"
            )
            return
        torch = software.get("torch", "")
        if not torch and (software or not self.spec.image):
            # A bare host, or an image the catalogue says has no PyTorch.
            self._emit(
                'Traceback (most recent call last):\r\n  File "/root/train.py", line 1, in <module>\r\n'
                "ModuleNotFoundError: No module named 'torch' (simulated: this instance's image "
                "has no PyTorch)\r\n"
            )
            return
        cuda = software.get("cuda", "")
        # The image's versions when the catalogue knows them; none claimed otherwise.
        versions = f" {torch}+cu{cuda.replace('.', '')}, CUDA {cuda}," if torch and cuda else ","
        world = max(1, len(self.node.gpus)) * max(1, len(self.spec.nodes))
        step_s = 0.4 * self.time_scale
        lines = [
            (
                0.3,
                f"[rank {self.node.rank}] torch{versions} {len(self.node.gpus)} GPU(s) visible",
            ),
            (
                0.6,
                f"[rank {self.node.rank}] world size {world}, NCCL backend, master {self.spec.master_addr or 'localhost'}:{self.spec.master_port}",
            ),
            (1.0, "loading dataset /pfs/datasets/alpaca-zh (52,002 samples) ... done"),
            (1.4, "model: 6.74B parameters (4.19M trainable, LoRA r=16)"),
        ]
        tokens = 3100 * max(1, len(self.node.gpus))
        for step in range(1, TRAIN_STEPS + 1):
            loss = 1.05 + 0.85 * 2.718 ** (-step / 6)
            lines.append(
                (
                    1.4 + step * step_s + 0.2,
                    f"step {step:>4}/{TRAIN_STEPS}  loss {loss:.4f}  lr 2.00e-04  {tokens:,} tok/s  "
                    f"gpu mem {profile_for(self.gpu_model).memory_mib / 1024 * 0.9:.1f} GiB",
                )
            )
        end = 1.6 + TRAIN_STEPS * step_s + 0.3
        lines.append((end, f"saved checkpoint to /pfs/checkpoints/demo/step-{TRAIN_STEPS}"))
        lines.append((end + 0.1, "training finished 完成"))
        start = time.monotonic()
        self._job = [(start + at * self.time_scale, text) for at, text in lines]

    def _python_c(self, code: str, software: dict[str, str]) -> None:
        """``python -c`` for the one-liners people check an image with: torch's version and
        whether it sees the GPUs. Anything else is not simulated (and says so)."""
        torch = software.get("torch", "")
        if "torch" in code and not torch and (software or not self.spec.image):
            self._emit("ModuleNotFoundError: No module named 'torch'\r\n")
            return
        if "torch" in code and not torch:
            self._emit("python -c: this image's versions are not in the catalogue (simulated)\r\n")
            return
        out = []
        if "torch.__version__" in code:
            out.append(f"{torch}+cu{software.get('cuda', '').replace('.', '')}")
        if "torch.version.cuda" in code:
            out.append(software.get("cuda", ""))
        if "is_available()" in code:
            out.append("True" if self.node.gpus else "False")
        if "device_count()" in code:
            out.append(str(len(self.node.gpus)))
        if not out:
            self._emit("python -c: only torch's version and GPU checks are simulated here\r\n")
            return
        self._emit("\r\n".join(out) + "\r\n")

    def _release_due(self) -> None:
        """Move the running program's lines whose time has come to the output."""
        if not self._job:
            return
        now = time.monotonic()
        while self._job and self._job[0][0] <= now:
            _due, text = self._job.pop(0)
            self._emit(text + "\r\n")
        if not self._job:
            self._emit(self._prompt())
