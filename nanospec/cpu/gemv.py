"""Few-row float32 linear layers on CPU through a small AVX2/AVX-512 kernel (gemv.c), compiled on first use.

A decode step multiplies one row by every weight, a target-verify a few rows: both are bound by reading
the weights once. On the AMD EPYC (two cores) of earlier sessions reading memory ran at about 35 GB/s,
oneDNN's one-row product on a prepacked weight at 17-27 GB/s and MKL's ``F.linear`` at about 12; gemv.c
read 25-36 GB/s on the same matrices (docs/cpu.md). It takes any number of rows (ops_linear.py sends it
up to ``MAX_ROWS``, and every row of a decode or verify pass) and sums each output in one order whatever
the row count, so a verify gives a decode step's bits (gemv.c).

The kernel is C compiled with the system compiler (``$CC``, else ``cc``) the first time a process needs it,
into ``$NANOSPEC_KERNEL_CACHE`` (default ``~/.cache/nanospec/kernels``), keyed by the source, the flags
and the compiler; a later process loads the cached library (Triton, a NanoSpec dependency, also builds its
launchers with the system C compiler). The flags add AVX-512 where the CPU has it (16-lane blocks, so
other bits than the AVX2 build; one host always builds the same). It is used only where it can be right
and fast: a Linux x86-64 CPU with AVX2 and FMA, a compiler that builds it, and one OpenMP runtime in the
process after loading it (its ``libgomp.so.1`` is PyTorch's, so both share one thread pool and
``torch.set_num_threads``). Otherwise ``available()`` is false, the reason is logged once, and callers
keep oneDNN.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("gemv.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
AVX512_FLAGS = ("-mavx512f",)
CACHE_ENV = "NANOSPEC_KERNEL_CACHE"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _openmp_runtimes() -> set[str]:
    """Paths of the OpenMP runtimes mapped into this process."""
    names = ("libgomp", "libiomp", "libomp")
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if any(n in line.rsplit("/", 1)[-1] for n in names)}


def flags() -> tuple[str, ...]:
    """The compiler flags for this CPU: AVX2 and FMA, plus AVX-512 where it has it."""
    return FLAGS + (AVX512_FLAGS if "avx512f" in _cpu_flags() else ())


def _build(cc: str) -> Path:
    """The compiled library for this source, flags and compiler, built now if not in the cache."""
    flags_ = flags()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *flags_, version]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "nanospec" / "kernels")
    path = cache / f"gemv-{key}.so"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    # A private name, then an atomic rename: processes building at once each install a whole file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    try:
        out = subprocess.run([cc, *flags_, str(SOURCE), "-o", tmp], capture_output=True, text=True,
                             timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"{cc} failed on {SOURCE}: {out.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None (reason logged once) where it cannot be used."""
    if platform.system() != "Linux" or platform.machine() != "x86_64" or not {"avx2", "fma"} <= _cpu_flags():
        log.info("NanoSpec gemv kernel off: needs Linux on an x86-64 CPU with AVX2 and FMA")
        return None
    before = _openmp_runtimes()
    try:
        lib = ctypes.CDLL(str(_build(os.environ.get("CC") or "cc")))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("NanoSpec gemv kernel off, linear layers use oneDNN: %s", e)
        return None
    if len(_openmp_runtimes()) > 1:
        log.warning("NanoSpec gemv kernel off: it brought a second OpenMP runtime next to %s", sorted(before))
        return None
    lib.nanospec_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3
    lib.nanospec_linear.restype = None
    return lib


def available() -> bool:
    return library() is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] float32 @ weight [N, K].T (+ bias [N]) -> [M, N] float32, M small (the kernel re-reads x
    for every output); every tensor contiguous on the CPU (the caller checks; ``available()`` must be
    true)."""
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    library().nanospec_linear(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                              out.data_ptr(), m, n, k)
    return out
