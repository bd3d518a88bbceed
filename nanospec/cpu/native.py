"""NanoSpec's C kernels for CPUs (gemv.c: few-row linear layers; attention.c: decode and verify attention;
stream.c: the streams' decode-step update, a verify's candidates and the packed head's row copies;
spec.c: greedy tree verification and KV-slot bookkeeping; topk.c: the k largest logits of a row),
compiled into one library on first use and loaded with ctypes.

The sources are compiled with the system compiler (``$CC``, else ``cc``) the first time a process needs
them, into ``$NANOSPEC_KERNEL_CACHE`` (default ``~/.cache/nanospec/kernels``), keyed by the sources, the
flags and the compiler; a later process loads the cached library (Triton, a NanoSpec dependency, also
builds its launchers with the system C compiler). The flags add AVX-512 where the CPU has it (16-lane
blocks, so other bits than the AVX2 build; one host always builds the same). The library is used only where
it can be right and fast: a Linux x86-64 CPU with AVX2 and FMA, a compiler that builds it, and one OpenMP
runtime in the process after loading it (its ``libgomp.so.1`` is PyTorch's, so both share one thread pool
and ``torch.set_num_threads``). Otherwise ``library()`` is None, the reason is logged once, and callers
keep their PyTorch paths.
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

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = (HERE / "gemv.c", HERE / "attention.c", HERE / "stream.c", HERE / "spec.c", HERE / "topk.c")
HEADERS = (HERE / "simd.h",)
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
AVX512_FLAGS = ("-mavx512f",)
CACHE_ENV = "NANOSPEC_KERNEL_CACHE"

_p, _l = ctypes.c_void_p, ctypes.c_long
# name: (argument types, result type)
SIGNATURES = {
    "nanospec_linear": ([_p] * 4 + [_l] * 3, None),
    "nanospec_linear_bf16": ([_p] * 4 + [_l] * 3, None),
    "nanospec_attention": ([_p, _l, _p, _l, _p, _l, _p, _p, _p, _l, _p, _l, _l, _p, _p, _p, _l, _l, _p, _l,
                            ctypes.c_int, _l, _p, _l, _l, _l, _l, _l, ctypes.c_float, ctypes.c_float, _l],
                           ctypes.c_int),
    "nanospec_stream_extend": ([_p] * 12 + [_l] * 5, ctypes.c_int),
    "nanospec_verify_candidates": ([_p] * 6 + [_l] * 2 + [_p, _l, _p, _p] + [_l] * 6 + [ctypes.c_int]
                                   + [_l] * 3 + [_p] * 3, ctypes.c_int),
    "nanospec_gather_rows": ([_p] * 4 + [_l] * 4, ctypes.c_int),
    "nanospec_verify_greedy": ([_p] * 8 + [_l] * 4, ctypes.c_int),
    "nanospec_kv_segments": ([_p, _l, _l, _p, _p, _p, _l, _p, _l, ctypes.c_int], ctypes.c_int),
    "nanospec_fill_bonus": ([_p, _l, _p, _p, _l, _l], ctypes.c_int),
    "nanospec_build_tree": ([_p, _l, _p, _l, _p, _p, _l] + [_p] * 4 + [_l] * 4 + [ctypes.c_int],
                            ctypes.c_int),
    "nanospec_topk": ([_p, _l, _l, _p, _l, _l, _l, _p], ctypes.c_int),
}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def openmp_runtimes() -> set[str]:
    """Paths of the OpenMP runtimes mapped into this process."""
    names = ("libgomp", "libiomp", "libomp")
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if any(n in line.rsplit("/", 1)[-1] for n in names)}


def flags() -> tuple[str, ...]:
    """The compiler flags for this CPU: AVX2 and FMA, plus AVX-512 where it has it."""
    return FLAGS + (AVX512_FLAGS if "avx512f" in cpu_flags() else ())


def _build(cc: str) -> Path:
    """The compiled library for these sources, flags and compiler, built now if not in the cache."""
    flags_ = flags()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    texts = [p.read_text() for p in SOURCES + HEADERS]
    key = hashlib.sha256("\0".join([*texts, *flags_, version]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "nanospec" / "kernels")
    path = cache / f"nanospec-{key}.so"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    # A private name, then an atomic rename: processes building at once each install a whole file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    try:
        out = subprocess.run([cc, *flags_, *map(str, SOURCES), "-o", tmp], capture_output=True, text=True,
                             timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"{cc} failed on {', '.join(p.name for p in SOURCES)}: "
                               f"{out.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (reason logged once) where they cannot be used."""
    if platform.system() != "Linux" or platform.machine() != "x86_64" or not {"avx2", "fma"} <= cpu_flags():
        log.info("NanoSpec C kernels off: they need Linux on an x86-64 CPU with AVX2 and FMA")
        return None
    before = openmp_runtimes()
    try:
        lib = ctypes.CDLL(str(_build(os.environ.get("CC") or "cc")))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("NanoSpec C kernels off (linear layers use oneDNN, attention PyTorch): %s", e)
        return None
    if len(openmp_runtimes()) > 1:
        log.warning("NanoSpec C kernels off: they brought a second OpenMP runtime next to %s", sorted(before))
        return None
    for name, (args, res) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def available() -> bool:
    return library() is not None
