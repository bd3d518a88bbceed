"""Acceptance check of NanoSpec on one CUDA GPU, in one command of a few minutes.

    python -m nanospec.bench.gpu_check [--dry] [--out DIR] [--only NAME,...] [--budget SECONDS]
                                       [--narrow-rows] [--inject-fault] [--plant-stale-rows]

It needs only torch, triton, numpy and NanoSpec (no SGLang, no download). It prints a header (date,
versions, device), one ``PASS|FAIL|SKIP name: detail`` line per check and a summary, and exits 1 if
any check failed; ``--out DIR`` also writes ``gpu_check.json`` and ``gpu_check.md`` there. Checks:

    imports           nanospec core (proposer, policy, streams) and nanospec.sglang.{runtime,...}
                      import without SGLang
    loop              SGLang's draft loop at Llama-3.1-8B head sizes (nanospec/bench/gpu_loop.py):
                      forward stream, eager after_verify with side-stream gathers, draft-extend
                      selecting rows before the head, draft steps in CUDA graphs per padded batch
                      replayed at smaller batches, full and reduced (hot map) draft vocabularies;
                      every step's ids equal to a float32 full-head reference over the active
                      vocabulary; times of the head, head + softmax + top-k and the draft step as
                      ratios to the full head
    kernels_match     Triton kernels vs their PyTorch twins over random start/extend/release
                      streams: every VocabState tensor and the packed buffer bit for bit, logits
                      against a float32 reference (V 32k and 128k, W 3072, d 4096 bf16, 48 slots)
    cuda_graph_heads  Proposer heads (packed / union / full) captured in a CUDA graph, state changed
                      between replays, replays against eager calls and a reference
    side_stream_race  a slowed-down side-stream gather: a replay without wait_gathers() reads stale
                      rows (reported, or "race not observed"), with it the rows are right
    no_host_sync      start / extend / logits / token_ids / the heads / Proposer.after_verify under
                      torch.cuda.set_sync_debug_mode("error")
    head_timing       packed vs full head over batch sizes (CUDA events), measured crossover vs
                      nanospec.policy's
    memory            state + packed buffer for 48 slots: allocated and peak bytes vs nbytes()

``--dry`` (automatic without CUDA) runs on the CPU what can run there: the loop at small sizes in
float32 without graphs or streams, kernels_match at small sizes when TRITON_INTERPRET=1 was set before
the start (else SKIP), a tiny CPU timing, nbytes against the layout formula; the CUDA-only checks print
SKIP. Self-tests of the checker: ``--inject-fault`` corrupts the PyTorch twin's state once during
kernels_match, ``--plant-stale-rows`` makes the loop's gathers skip rows; either check must then FAIL.
kernels_match also appends candidate rows with more distinct tokens than W (in-step eviction, which
only tiny windows meet in serving; on the GPU through an extra W = 64 stream); ``--narrow-rows``
leaves them out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nanospec import DynamicVocab, NanoSpecConfig
from nanospec.bench import gpu_loop
from nanospec.bench.gpu_loop import SLEEP_CYCLES, capture, cpu_median_ms, gpu_median_ms

ROOT = Path(__file__).resolve().parents[2]

STATE_FIELDS = ("col_of", "col_tok", "count", "ring", "stack", "nfree", "pos", "gathered")
K_PRE = 3
INF = float("-inf")
# (rtol, atol relative to the largest |reference|): float32 accumulation, and bf16-rounded outputs
# (cuBLAS or CPU bf16 matmuls round their results to 8 significant bits).
TIGHT_TOL = (1e-4, 1e-4)
BF16_TOL = (1.6e-2, 1e-2)
FORBIDDEN = ("sglang", "sgl_kernel", "transformers", "vllm", "flashinfer")
ALLOWED = ("nanospec", "numpy", "torch", "triton")


@dataclass(frozen=True)
class Shape:
    """Sizes of one DynamicVocab: vocabulary V, window W, hidden size d, request slots R."""

    vocab: int
    w_max: int
    dim: int
    slots: int
    dtype: torch.dtype = torch.bfloat16

    def label(self) -> str:
        return f"V={self.vocab} W={self.w_max} d={self.dim} R={self.slots}"


LLAMA3 = Shape(128_256, 3072, 4096, 48)
GPU_KERNEL_SHAPES = (Shape(32_000, 3072, 4096, 48), LLAMA3)
DRY_KERNEL_SHAPES = (Shape(1024, 64, 32, 6), Shape(33_000, 64, 32, 6))
# --wide-rows on the GPU: rows wider than W need a small W (a 4096-lane kernel would not compile well).
GPU_WIDE_SHAPE = Shape(32_000, 64, 4096, 48)
GPU_ROW_WIDTH = 64  # candidates per row at W 3072: a large draft tree plus its top-k
GRAPH_SHAPE = Shape(128_256, 3072, 4096, 8)  # 4 requests are used; the slots only size the buffers
RACE_SHAPE = Shape(128_256, 3072, 4096, 8)
SYNC_SHAPE = Shape(32_000, 3072, 4096, 8)
TIMING_BATCHES = [1, 2, 4, 8, 16, 24, 32, 40, 44, 48]
DRY_TIMING_SHAPE = Shape(8192, 256, 64, 16, torch.float32)


@dataclass
class Outcome:
    status: str  # PASS | FAIL | SKIP
    detail: str
    data: dict = field(default_factory=dict)  # measurements for the JSON report
    seconds: float = 0.0


def passed(detail: str, data: dict | None = None) -> Outcome:
    return Outcome("PASS", detail, data or {})


def failed(detail: str, data: dict | None = None) -> Outcome:
    return Outcome("FAIL", detail, data or {})


def skipped(reason: str) -> Outcome:
    return Outcome("SKIP", reason)


@dataclass
class Ctx:
    """What every check may read: where it runs and how much time is left."""

    cuda: bool  # full run on the GPU (False: --dry on the CPU)
    interpret: bool  # the Triton interpreter is on (kernels can run on the CPU)
    inject_fault: bool = False
    plant_stale: bool = False  # the loop's gathers skip rows, so the loop check must FAIL
    wide_rows: bool = True  # kernels_match also appends rows with more than W distinct candidates
    deadline: float = float("inf")  # time.monotonic() at which the budget ends

    @property
    def device(self) -> torch.device:
        return torch.device("cuda") if self.cuda else torch.device("cpu")

    def time_left(self) -> float:
        return self.deadline - time.monotonic()


# -- helpers shared by the checks -------------------------------------------------------------------


def make_weight(shape: Shape, device: torch.device, seed: int) -> torch.Tensor:
    """A random LM head [V, d] scaled so that logits of unit-normal hidden states are O(1)."""
    g = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(shape.vocab, shape.dim, generator=g, device=device, dtype=torch.float32)
    return w.mul_(shape.dim**-0.5).to(shape.dtype)


class Traffic:
    """Random request traffic for a pool of slots, drawn on the host from one seed.

    Token ids come mostly from a skewed hot set (repeats within and across steps, counts above one,
    tokens evicted and re-added), the rest uniformly from the vocabulary (new rows to gather).
    """

    def __init__(self, vocab: int, w_max: int, seed: int, max_width: int, hot_frac: float = 0.7):
        self.g = torch.Generator().manual_seed(seed)
        self.vocab, self.w_max, self.max_width, self.hot_frac = vocab, w_max, max_width, hot_frac
        self.hot = torch.randperm(vocab, generator=self.g)[: min(vocab, 2 * w_max)]

    def randint(self, low: int, high: int) -> int:
        """Uniform int in [low, high]."""
        return int(torch.randint(low, high + 1, (1,), generator=self.g))

    def chance(self, p: float) -> bool:
        return float(torch.rand((), generator=self.g)) < p

    def tokens(self, *shape: int) -> torch.Tensor:
        """Token ids [*shape] int64."""
        skew = (torch.rand(shape, generator=self.g) ** 2 * self.hot.numel()).long()
        uniform = torch.randint(0, self.vocab, shape, generator=self.g)
        return torch.where(torch.rand(shape, generator=self.g) < self.hot_frac, self.hot[skew], uniform)

    def prompt(self, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """prompt_ids [L] and prefill_topk [L, K_PRE], L in [1, max_len]."""
        n = self.randint(1, max_len)
        return self.tokens(n), self.tokens(n, K_PRE)

    def step(self, live: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """reqs [B] distinct slots of ``live``, candidates [B, C] int64, valid [B, C] bool."""
        order = torch.randperm(len(live), generator=self.g)[: self.randint(1, len(live))]
        reqs = torch.tensor(live)[order]
        c = self.randint(1, self.max_width)
        valid = torch.rand(len(reqs), c, generator=self.g) < 0.85
        return reqs, self.tokens(len(reqs), c), valid


def settle(device: torch.device, *vocabs: DynamicVocab) -> None:
    """Let pending side-stream gathers land before the host compares buffers."""
    for dv in vocabs:
        dv.wait_gathers()
    if device.type == "cuda":
        torch.cuda.synchronize()


def state_mismatches(a: DynamicVocab, b: DynamicVocab) -> list[str]:
    """Names of the VocabState tensors, and "packed" for the packed buffer [R, W, d], that are not
    bit-identical between ``a`` and ``b`` (free columns' stale rows included; spare rows not)."""
    bad = [n for n in STATE_FIELDS if not torch.equal(getattr(a.state, n), getattr(b.state, n))]
    pa, pb = a.head.packed, b.head.packed
    if (pa is None) != (pb is None):
        bad.append("packed")
    elif pa is not None and not torch.equal(_bits(pa), _bits(pb)):
        bad.append("packed")
    return bad


def state_violations(dv: DynamicVocab, slots: list[int]) -> list[str]:
    """Invariants of docs/core.md, for live ``slots``, that both back ends could break alike (so
    bit-identity cannot see it): counts non-negative and positive exactly at live columns,
    sum(count) = min(pos, W), nfree = W - live columns, col_of the inverse of col_tok."""
    st, w = dv.state, dv.w_max
    r = torch.tensor(slots, device=st.pos.device)
    count, tok, col_of = st.count[r].long(), st.col_tok[r].long(), st.col_of[r].long()
    live = tok >= 0
    n_live = live.sum(1)
    cols = torch.arange(w, device=tok.device).expand_as(tok)
    checks = {
        "negative count": bool((count >= 0).all()),
        "count > 0 not exactly at live columns": torch.equal(count > 0, live),
        "sum(count) != min(pos, W)": torch.equal(count.sum(1), st.pos[r].clamp(max=w)),
        "nfree != W - live columns": torch.equal(st.nfree[r].long(), w - n_live),
        "col_of is not the inverse of col_tok": bool((col_of.gather(1, tok.clamp_min(0)) == cols)[live].all())
        and torch.equal((col_of >= 0).sum(1), n_live),
    }
    return [name for name, ok in checks.items() if not ok]


def _bits(t: torch.Tensor) -> torch.Tensor:
    # torch.equal compares values (-0.0 == 0.0); a copy must preserve the bits.
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.element_size()]) if t.is_floating_point() else t


def reference_logits(weight: torch.Tensor, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Float32 logits [N, K] of hidden [N, d] against rows ``ids`` of weight [V, d]: ids is [N, K]
    (per row) or [K] (shared); -1 marks a free column, whose logit is -inf."""
    if ids.dim() == 1:
        out = hidden.float() @ weight.index_select(0, ids.clamp_min(0)).float().T
        return out.masked_fill_(ids[None, :] < 0, INF)
    out = torch.empty(ids.shape, dtype=torch.float32, device=hidden.device)
    for i in range(ids.shape[0]):  # one row at a time: [K, d] float32 copies, not [N, K, d]
        out[i] = weight.index_select(0, ids[i].clamp_min(0)).float() @ hidden[i].float()
    return out.masked_fill_(ids < 0, INF)


def compare_logits(got: torch.Tensor, ref: torch.Tensor,
                   tol: tuple[float, float]) -> tuple[float, str | None]:
    """Compare logits got [N, K] with ref [N, K]: -inf exactly where ref has it, finite values within
    atol * max|ref| + rtol * |ref| (tol = (rtol, atol)). Returns (largest error / max|ref|, None) or
    (that error, what differs)."""
    if got.shape != ref.shape:
        return float("inf"), f"shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    g_inf, r_inf = torch.isneginf(got), torch.isneginf(ref)
    if not torch.equal(g_inf, r_inf):
        return float("inf"), f"-inf pattern differs at {int((g_inf != r_inf).sum())} of {got.numel()} columns"
    live = ~r_inf
    if not bool(live.any()):
        return 0.0, None
    g, r = got[live].double(), ref[live].double()
    if not bool(torch.isfinite(g).all()):
        return float("inf"), "non-finite logits at live columns"
    scale = max(float(r.abs().max()), 1e-30)
    err = (g - r).abs()
    rel = float(err.max()) / scale
    bad = int((err > tol[1] * scale + tol[0] * r.abs()).sum())
    if not bad:
        return rel, None
    return rel, f"{bad} of {g.numel()} logits off (max error {rel:.2e} of max|ref| {scale:.3g})"


def uses_triton(dv: DynamicVocab) -> bool:
    """Whether dv's logits come from the Triton kernel (float32 accumulation, exact to TIGHT_TOL)."""
    return dv.ops.__name__.endswith("triton_ops")


def where(exc: BaseException) -> str:
    """file:line of the innermost frame of ``exc`` inside this repository (else the innermost)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f.filename.startswith(str(ROOT))]
    if not (ours or frames):
        return "?"
    f = (ours or frames)[-1]
    name = str(Path(f.filename).relative_to(ROOT)) if ours else f.filename
    return f"{name}:{f.lineno}"


def describe(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first} (at {where(exc)})"


def start_full(dv: DynamicVocab, slot: int, traffic: Traffic, device: torch.device) -> None:
    """Start ``slot`` with a prompt of W tokens, so its window is full and every extend evicts."""
    prompt = traffic.tokens(dv.w_max).to(device)
    dv.start(slot, prompt, traffic.tokens(dv.w_max, K_PRE).to(device))


# -- imports -------------------------------------------------------------------------------------------

IMPORT_PROBE = """
import json, sys
import torch, triton
before = set(sys.modules)
import nanospec, nanospec.vocab, nanospec.head, nanospec.state, nanospec.config
import nanospec.kernels, nanospec.kernels.torch_ops, nanospec.kernels.triton_ops
import nanospec.proposer, nanospec.policy, nanospec.streams, nanospec.sglang.runtime
import nanospec.sglang.settings, nanospec.sglang.telemetry
print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
"""


def foreign_modules(new: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split top-level module names into (forbidden ones, other non-stdlib ones beyond ALLOWED)."""
    new = set(new)
    forbidden = sorted(new & set(FORBIDDEN))
    other = sorted(m for m in new - set(FORBIDDEN) - set(ALLOWED)
                   if m not in sys.stdlib_module_names and not m.startswith("_"))
    return forbidden, other


def check_imports(ctx: Ctx) -> Outcome:
    """Import the core and the engine-facing plugin modules in a fresh interpreter (after torch and
    triton) and list what else they load: nothing beyond numpy and the standard library may appear."""
    proc = subprocess.run([sys.executable, "-c", IMPORT_PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return failed(f"importing the core / nanospec.sglang.runtime failed: {tail}")
    new = json.loads(proc.stdout.strip().splitlines()[-1])
    forbidden, other = foreign_modules(new)
    if forbidden or other:
        return failed(f"importing nanospec loads {forbidden + other} (allowed: {list(ALLOWED)} + stdlib)")
    return passed("nanospec core (proposer, policy, streams) + nanospec.sglang.{runtime,settings,telemetry} "
                  "load "
                  f"no SGLang; new top-level modules: {[m for m in new if m in ALLOWED] or 'none'} + stdlib")


# -- loop -----------------------------------------------------------------------------------------------


def check_loop(ctx: Ctx) -> Outcome:
    """SGLang's draft loop (nanospec/bench/gpu_loop.py) for a full and a reduced draft vocabulary, every
    step's ids against the reference; then the head times as ratios to the full head."""
    shape = gpu_loop.LLAMA3_LOOP if ctx.cuda else gpu_loop.DRY_LOOP
    seconds, rounds = (45.0, 400) if ctx.cuda else (20.0, 30)  # per vocabulary
    # Dry, under the interpreter: the Triton kernels (those the GPU runs) in the loop, fewer rounds.
    backend = "triton" if ctx.interpret and not ctx.cuda else "auto"
    if backend == "triton":
        rounds = 12
    data: dict = {"shape": {k: (str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v)
                            for k, v in dataclasses.asdict(shape).items()}}
    parts = []
    for reduced in (False, True):
        name = f"reduced V_d={shape.draft_vocab}" if reduced else f"full V_d={shape.vocab}"
        s = gpu_loop.run_loop(shape, reduced, ctx.cuda, min(seconds, max(1.0, ctx.time_left() / 4)), rounds,
                              plant_stale=ctx.plant_stale, backend=backend)
        data[name] = {"rounds": s.rounds, "ids_compared": s.compared, "near_ties": s.near_ties,
                      "starts": s.starts, "batch_on_graph": sorted(s.batch_sizes), "mismatch": s.mismatch}
        if s.mismatch:
            note = " (stale rows planted by --plant-stale-rows)" if ctx.plant_stale else ""
            return failed(f"{name}: {s.mismatch}{note}", data)
        if not s.rounds:
            return failed(f"{name}: no round ran (time budget)", data)
        parts.append(f"{name}: {s.rounds} rounds, {s.compared} ids equal to the reference "
                     f"({s.near_ties} at near-ties), {s.starts} starts, batch/graph {sorted(s.batch_sizes)}")
        gc.collect()
    times = {}
    for batch in ((1, max(shape.batches)) if ctx.cuda else (2,)):
        t = gpu_loop.time_heads(shape, batch, ctx.cuda)
        times[f"B={batch}"] = {k: {"ms": v, "vs_full_head": v / t["full head"]} for k, v in t.items()}
    data["times"] = times
    timing = "; ".join(f"{b} ({shape.topk} rows/request): " + ", ".join(
        f"{k} {v['ms']:.3f} ms ({v['vs_full_head']:.3f}x)" for k, v in t.items()) for b, t in times.items())
    where_ = (f"CUDA graphs on a forward stream, {str(shape.dtype).removeprefix('torch.')}" if ctx.cuda
              else f"dry: CPU, float32, eager, no streams, {backend} kernels")
    return passed(f"{where_}, V={shape.vocab} d={shape.dim} W={shape.w_max} graphs {list(shape.batches)}; "
                  + "; ".join(parts) + f"; times vs the full head: {timing}", data)


# -- 1. kernels_match ------------------------------------------------------------------------------------


@dataclass
class StreamStats:
    steps: int = 0
    starts: int = 0
    releases: int = 0
    appended: int = 0
    err_triton: float = 0.0
    err_twin: float = 0.0
    active: float = 0.0
    capped: bool = False


def lifecycle(traffic: Traffic, pair: tuple[DynamicVocab, DynamicVocab], live: list[int],
              stats: StreamStats, device: torch.device) -> None:
    """Release a live slot now and then and start a free one, identically on both vocabularies; the
    first call starts every slot."""
    n_slots = pair[0].max_requests
    if live and traffic.chance(0.08):
        slot = live.pop(traffic.randint(0, len(live) - 1))
        for dv in pair:
            dv.release(slot)
        stats.releases += 1
    free = [s for s in range(n_slots) if s not in live]
    if stats.steps == 0:
        todo = free
    elif free and (not live or traffic.chance(0.15)):
        todo = [free[traffic.randint(0, len(free) - 1)]]
    else:
        todo = []
    for slot in todo:
        prompt, topk = traffic.prompt(2 * pair[0].w_max)
        for dv in pair:
            dv.start(slot, prompt.to(device), topk.to(device))
        live.append(slot)
        stats.starts += 1


def compare_step_logits(tri: DynamicVocab, twin: DynamicVocab, live: list[int], traffic: Traffic,
                        stats: StreamStats, device: torch.device) -> str | None:
    """Logits of both back ends for 8 random rows of live slots against the float32 reference over
    each slot's col_tok (which also proves the gathered rows are the right ones)."""
    rows = torch.tensor(live)[torch.randint(0, len(live), (8,), generator=traffic.g)].to(device)
    hidden = torch.randn(8, tri.dim, device=device).to(tri.weight.dtype)
    ref = reference_logits(tri.weight, hidden, tri.state.col_tok[rows].long())
    twin_tol = TIGHT_TOL if tri.weight.dtype == torch.float32 else BF16_TOL
    for name, dv, tol in (("triton", tri, TIGHT_TOL), ("torch", twin, twin_tol)):
        err, msg = compare_logits(dv.logits(hidden, rows), ref, tol)
        if msg:
            return f"{name} logits: {msg}"
        attr = "err_triton" if name == "triton" else "err_twin"
        setattr(stats, attr, max(getattr(stats, attr), err))
    return None


def kernel_plan(ctx: Ctx) -> list[tuple[Shape, int]]:
    """(shape, widest candidate row) of every kernels_match stream. Rows wider than W (in-step
    eviction) only with --wide-rows."""
    if ctx.cuda:
        plan = [(shape, GPU_ROW_WIDTH) for shape in GPU_KERNEL_SHAPES]
        return plan + ([(GPU_WIDE_SHAPE, 2 * GPU_WIDE_SHAPE.w_max)] if ctx.wide_rows else [])
    return [(shape, (2 if ctx.wide_rows else 1) * shape.w_max) for shape in DRY_KERNEL_SHAPES]


def run_stream(shape: Shape, width: int, steps: int, seconds: float, ctx: Ctx,
               seed: int) -> tuple[str | None, StreamStats]:
    """Drive a Triton and a PyTorch DynamicVocab with the same traffic (rows of up to ``width``
    candidates); compare after every step. Returns (first difference or None, statistics)."""
    dev = ctx.device
    weight = make_weight(shape, dev, seed)
    cfg = NanoSpecConfig(k_pre=K_PRE, w_max=shape.w_max)
    tri = DynamicVocab(weight, shape.slots, cfg, backend="triton")
    twin = DynamicVocab(weight, shape.slots, cfg, backend="torch")
    traffic = Traffic(shape.vocab, shape.w_max, seed, max_width=width)
    live: list[int] = []
    stats, t0 = StreamStats(), time.monotonic()
    for step in range(steps):
        lifecycle(traffic, (tri, twin), live, stats, dev)
        reqs, cands, valid = traffic.step(live)
        for dv in (tri, twin):
            dv.extend(reqs.to(dev), cands.to(dev), valid.to(dev))
        stats.steps, stats.appended = step + 1, stats.appended + int(valid.sum())
        if ctx.inject_fault and step == 2:
            twin.state.pos[live[0]] += 1  # self-test: the comparison below must catch this
        settle(dev, tri, twin)
        bad = state_mismatches(tri, twin)
        if bad:
            return f"step {step}: {', '.join(bad)} not bit-identical", stats
        bad = state_violations(tri, live)
        if bad:
            return f"step {step}: state of both back ends invalid: {', '.join(bad)}", stats
        msg = compare_step_logits(tri, twin, live, traffic, stats, dev)
        if msg:
            return f"step {step}: {msg}", stats
        if time.monotonic() - t0 > seconds or ctx.time_left() < 60:
            stats.capped = True
            break
    stats.active = float((shape.w_max - tri.state.nfree[torch.tensor(live, device=dev)]).float().mean())
    return None, stats


def check_kernels(ctx: Ctx) -> Outcome:
    """Check 1: Triton kernels against their PyTorch twins, bit for bit."""
    if not ctx.cuda and not ctx.interpret:
        return skipped("Triton on the CPU needs TRITON_INTERPRET=1 set before the start (dry run)")
    steps, seconds = (250, 50.0) if ctx.cuda else (24, 20.0)  # 3 streams: leaves the budget room
    parts = []
    for i, (shape, width) in enumerate(kernel_plan(ctx)):
        diff, s = run_stream(shape, width, steps, seconds, ctx, seed=100 + i)
        if diff:
            note = " (fault injected by --inject-fault)" if ctx.inject_fault else ""
            return failed(f"{shape.label()} rows <= {width}: {diff}{note}")
        cap = " (time cap)" if s.capped else ""
        parts.append(f"{shape.label()} rows <= {width}: {s.steps} steps{cap}, {s.starts} starts, "
                     f"{s.releases} releases, {s.appended} candidates, mean active {s.active:.0f}, logits "
                     f"err triton {s.err_triton:.1e} torch {s.err_twin:.1e}")
        gc.collect()
    where_ = "CUDA" if ctx.cuda else "CPU, Triton interpreter"
    return passed(f"state + packed bit-identical and state invariants held after every step ({where_}, "
                  f"{str(shape.dtype).removeprefix('torch.')}); " + "; ".join(parts))


# -- 2. cuda_graph_heads ---------------------------------------------------------------------------------


def column_ids(head, kind: str, rows: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
    """Token id of every logits column for the current state: [N, W] (packed), [U] (union), [V] (full)."""
    if kind == "packed":
        return head.dv.column_tokens()[rows].long()
    if kind == "union":
        return columns
    return torch.arange(head.vocab, device=rows.device)


def expected_union(head, reqs: torch.Tensor, cap: int) -> torch.Tensor:
    """Sorted distinct active tokens of reqs [B], first ``cap``, -1 padded: [cap] int64."""
    toks = head.dv.column_tokens()[reqs].reshape(-1).long()
    toks = toks[toks >= 0].unique()[:cap]
    return torch.cat([toks, toks.new_full((cap - toks.numel(),), -1)])


def replay_round(head, kind: str, graph, outs, static: dict, traffic: Traffic, columns) -> str | None:
    """Change the state (extend with new tokens), copy a new hidden into the static buffer, wait,
    replay, and compare with an eager call and the reference. Returns what differs, or None."""
    dev, reqs, hidden = static["hidden"].device, static["reqs"], static["hidden"]
    g_logits, g_top, g_ids = outs
    b = reqs.numel()
    head.dv.extend(reqs, traffic.tokens(b, 64).to(dev), torch.ones(b, 64, dtype=torch.bool, device=dev))
    hidden.copy_(torch.randn(hidden.shape, device=dev).to(hidden.dtype))
    head.dv.wait_gathers()
    graph.replay()
    e_logits, _, e_ids = static["body"]()
    torch.cuda.synchronize()
    rows = reqs.repeat_interleave(hidden.shape[0] // b)
    if kind == "union" and not torch.equal(columns, expected_union(head, reqs, columns.numel())):
        return "union columns of the replay are not the union of the new state"
    ids = column_ids(head, kind, rows, columns)
    tol = TIGHT_TOL if kind == "packed" and uses_triton(head.dv) else BF16_TOL
    for what, got, ref in (("vs eager", g_logits, e_logits),
                           ("vs reference", g_logits, reference_logits(head.weight, hidden, ids))):
        _, msg = compare_logits(got, ref, tol)
        if msg:
            return f"replayed logits {what}: {msg}"
    want = (ids.expand(g_top.shape[0], -1) if ids.dim() == 1 else ids).gather(1, g_top).clamp_min(0)
    if not torch.equal(g_ids, want):
        return "replayed token_ids do not map the replayed top-k columns to their tokens"
    if not torch.equal(g_ids.sort(-1).values, e_ids.sort(-1).values):
        return "replayed token_ids differ from eager ones"
    return None


def graph_one_head(kind: str, weight: torch.Tensor, shape: Shape, traffic: Traffic) -> str | None:
    """Capture one forced Proposer head's logits + top-8 + token_ids and replay it over 4 state changes."""
    from nanospec.proposer import Proposer

    dev = weight.device
    head = Proposer(weight, shape.slots, NanoSpecConfig(k_pre=K_PRE, w_max=shape.w_max), head=kind)
    for slot in range(4):
        start_full(head.dv, slot, traffic, dev)
    static = {"reqs": torch.arange(4, device=dev),
              "hidden": torch.randn(8, shape.dim, device=dev).to(weight.dtype)}

    def body():
        out = static["last"] = head.logits(static["hidden"], static["reqs"])
        top = out.logits.topk(8, dim=-1).indices
        return out.logits, top, out.token_ids(top)

    static["body"] = body
    ptrs = (head.dv.head.packed_flat.data_ptr(), head.dv.state.col_tok.data_ptr())
    head.dv.wait_gathers()
    graph, outs = capture(body)
    columns = static["last"].table[0] if kind == "union" else None  # the graph's own union buffer
    for r in range(4):
        diff = replay_round(head, kind, graph, outs, static, traffic, columns)
        if diff:
            return f"{kind} replay {r}: {diff}"
    if (head.dv.head.packed_flat.data_ptr(), head.dv.state.col_tok.data_ptr()) != ptrs:
        return f"{kind}: packed buffer or col_tok moved after capture"
    return None


def check_cuda_graphs(ctx: Ctx) -> Outcome:
    """Check 2: CUDA-graph capture and replay of the draft head path."""
    if not ctx.cuda:
        return skipped("needs CUDA (dry run)")
    shape = GRAPH_SHAPE
    weight = make_weight(shape, ctx.device, seed=200)
    for kind in ("packed", "union", "full"):
        diff = graph_one_head(kind, weight, shape, Traffic(shape.vocab, shape.w_max, 201, 64, hot_frac=0.3))
        if diff:
            return failed(diff)
        gc.collect()
        torch.cuda.empty_cache()
    return passed(f"packed, union, full: 4 replays each (4 requests x 2 rows, {shape.label()}, extend of 64 "
                  "tokens before each) match eager calls and the reference; token_ids right; packed buffer "
                  "and col_tok data_ptr unchanged")


# -- 3. side_stream_race --------------------------------------------------------------------------------


class SlowGather:
    """Stands in for a kernel module: ``gather`` first sleeps on its (side) stream, everything else is
    the real op. Makes the copy of newly active rows land long after the caller moved on."""

    def __init__(self, ops, cycles: int):
        self._ops, self._cycles = ops, cycles

    def __getattr__(self, name: str):
        return getattr(self._ops, name)

    def gather(self, weight: torch.Tensor, packed_flat: torch.Tensor, dst: torch.Tensor,
               src: torch.Tensor) -> None:
        torch.cuda._sleep(self._cycles)
        self._ops.gather(weight, packed_flat, dst, src)


def race_round(dv: DynamicVocab, graph, out: torch.Tensor, static: dict, fresh: torch.Tensor,
               mode: str) -> tuple[int, int]:
    """Extend with ``fresh`` [B, C] never-active tokens, then read logits: "graph" replays without
    waiting, "waited" calls wait_gathers() first, "eager" calls dv.logits (which waits by itself).
    Returns (wrong new columns, new columns)."""
    dev, reqs, hidden = fresh.device, static["reqs"], static["hidden"]
    before = dv.state.col_tok[reqs].clone()
    dv.extend(reqs, fresh, torch.ones(fresh.shape, dtype=torch.bool, device=dev))
    hidden.copy_(torch.randn(hidden.shape, device=dev).to(hidden.dtype))
    if mode == "waited":
        dv.wait_gathers()
    if mode == "eager":
        got = dv.logits(hidden, reqs)
    else:
        graph.replay()
        got = out
    torch.cuda.synchronize()
    ids = dv.state.col_tok[reqs].long()
    ref = reference_logits(dv.weight, hidden, ids)
    new = (ids != before.long()) & (ids >= 0)
    # A stale row is off by a whole logit (zeros, or an evicted token's row), far above this.
    wrong = ((got - ref).abs() > 1e-2 * float(ref[ids >= 0].abs().max())) & new
    return int(wrong.sum()), int(new.sum())


def check_side_stream_race(ctx: Ctx) -> Outcome:
    """Check 3: the side-stream gather race, made visible by a slow gather."""
    if not ctx.cuda:
        return skipped("needs CUDA (dry run)")
    shape, dev = RACE_SHAPE, ctx.device
    weight = make_weight(shape, dev, seed=300)
    dv = DynamicVocab(weight, shape.slots, NanoSpecConfig(k_pre=K_PRE, w_max=shape.w_max), check_inputs=False)
    half = shape.vocab // 2
    for slot in range(4):  # prompts from the lower half: the upper half is never active before a round
        dv.start(slot, torch.randint(0, half, (1000,), device=dev))
    static = {"reqs": torch.arange(4, device=dev),
              "hidden": torch.randn(4, shape.dim, device=dev).to(weight.dtype)}
    dv.wait_gathers()
    graph, out = capture(lambda: dv.logits(static["hidden"], static["reqs"]))
    dv.head.ops = SlowGather(dv.head.ops, SLEEP_CYCLES)
    fresh = torch.randperm(shape.vocab - half, device=dev)[: 3 * 4 * 64].view(3, 4, 64) + half
    modes = ("graph", "waited", "eager")
    results = {m: race_round(dv, graph, out, static, fresh[i], m) for i, m in enumerate(modes)}
    (stale, n_new), (w_bad, _), (e_bad, _) = results["graph"], results["waited"], results["eager"]
    seen = f"{stale}/{n_new} new columns stale (race visible)" if stale else "race not observed"
    detail = (f"replay without wait_gathers(): {seen}; with wait_gathers(): {w_bad} wrong; eager logits "
              f"(waits itself): {e_bad} wrong (gather delayed by torch.cuda._sleep({SLEEP_CYCLES}))")
    return failed(detail) if w_bad or e_bad else passed(detail)


# -- 4. no_host_sync -----------------------------------------------------------------------------------


class SyncProbe:
    """Runs calls; when ``armed``, under torch.cuda.set_sync_debug_mode("error") and records the
    calls that synchronise with the host (then runs them again unarmed for their result)."""

    def __init__(self) -> None:
        self.armed = False
        self.syncing: dict[str, str] = {}
        self.checked: list[str] = []

    def __call__(self, name: str, fn: Callable, *args, **kwargs):
        if not self.armed:
            return fn(*args, **kwargs)
        if name not in self.checked:
            self.checked.append(name)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            if "synchroniz" not in str(e).lower():
                raise
            self.syncing.setdefault(name, where(e))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return fn(*args, **kwargs)


def verify_inputs(traffic: Traffic, reqs: torch.Tensor, vocab: int, tree: int = 8,
                  width: int = 4) -> dict[str, torch.Tensor]:
    """Arguments of Runtime.after_verify for reqs [B] (device), built before any check so no host
    copy happens inside: draft_tokens [B*T], accept_index [B, S1], accept_lens [B], predict [B*T],
    logits [B*T, V]."""
    b, dev = reqs.numel(), reqs.device
    lens = torch.randint(1, width + 1, (b,), generator=traffic.g)
    pos = torch.arange(width)
    index = torch.where(pos[None, :] < lens[:, None], torch.arange(b)[:, None] * tree + pos[None, :], -1)
    host = {"draft_tokens": traffic.tokens(b * tree), "accept_index": index, "accept_lens": lens,
            "predict": traffic.tokens(b * tree), "logits": torch.randn(b * tree, vocab, generator=traffic.g)}
    return {"reqs": reqs, **{k: v.to(dev) for k, v in host.items()}}


def sync_calls(probe: SyncProbe, dv: DynamicVocab, heads: dict, runtime, args: dict) -> None:
    """One pass over every call that a decode step makes (probe decides whether it is checked)."""
    reqs, hidden, prompt, topk = args["reqs"], args["hidden"], args["prompt"], args["topk"]
    probe("DynamicVocab.start", dv.start, 0, prompt, topk)
    probe("DynamicVocab.extend", dv.extend, reqs, args["cands"], args["valid"])
    logits = probe("DynamicVocab.logits", dv.logits, hidden, reqs)
    probe("DynamicVocab.token_ids", dv.token_ids, reqs, logits.topk(8, dim=-1).indices)
    for kind, head in heads.items():
        out = probe(f"Proposer.logits[{kind}]", head.logits, hidden, reqs)
        probe(f"DraftLogits.token_ids[{kind}]", out.token_ids, out.logits.topk(8, dim=-1).indices)
        probe(f"DraftLogits.to_vocab[{kind}]", out.to_vocab)
    if runtime is not None:
        # Enough steps for the union probe to measure once and be read once.
        for _ in range(2 * args["probe_every"] + 1):
            probe("Runtime.after_verify", runtime.after_verify, **args["verify"])


def build_sync_subjects(shape: Shape, dev: torch.device, traffic: Traffic):
    """The DynamicVocab, forced Proposer heads and a head="auto" Runtime under test, slots 0..3
    started, and their device-resident arguments. Runtime is None (with the reason) if it cannot be
    imported."""
    from nanospec.proposer import UNION_PROBE_EVERY, Proposer

    weight = make_weight(shape, dev, seed=400)
    cfg = NanoSpecConfig(k_pre=K_PRE, w_max=shape.w_max)
    dv = DynamicVocab(weight, shape.slots, cfg, check_inputs=False)
    heads = {k: Proposer(weight, shape.slots, cfg, head=k) for k in ("packed", "union", "full")}
    runtime, why, probe_every = None, "", UNION_PROBE_EVERY
    try:
        from nanospec.sglang import runtime as rt_mod
        from nanospec.sglang.settings import Settings

        runtime = rt_mod.Runtime(weight, shape.slots, Settings(vocab=cfg, head="auto"),
                                 target_vocab=shape.vocab)
    except ImportError as e:
        why = describe(e)
    for target in [dv, *(h.dv for h in heads.values())] + ([runtime.proposer.dv] if runtime else []):
        for slot in range(4):
            start_full(target, slot, traffic, dev)
    reqs = torch.arange(4, device=dev)
    args = {"reqs": reqs, "hidden": torch.randn(4, shape.dim, device=dev).to(weight.dtype),
            "prompt": traffic.tokens(500).to(dev), "topk": traffic.tokens(500, K_PRE).to(dev),
            "cands": traffic.tokens(4, 40).to(dev), "valid": torch.ones(4, 40, dtype=torch.bool, device=dev),
            "verify": verify_inputs(traffic, reqs, shape.vocab), "probe_every": probe_every}
    return dv, heads, runtime, why, args


def check_no_host_sync(ctx: Ctx) -> Outcome:
    """Check 4: no host synchronisation in the decode-step calls."""
    if not ctx.cuda:
        return skipped("needs CUDA (dry run)")
    shape = SYNC_SHAPE
    traffic = Traffic(shape.vocab, shape.w_max, 401, 40)
    dv, heads, runtime, why, args = build_sync_subjects(shape, ctx.device, traffic)
    probe = SyncProbe()
    sync_calls(probe, dv, heads, runtime, args)  # warm-up: compiles and caching allocators outside the check
    torch.cuda.synchronize()
    probe.armed = True
    sync_calls(probe, dv, heads, runtime, args)
    torch.cuda.synchronize()
    missing = f"; Runtime.after_verify NOT checked ({why})" if runtime is None else ""
    if probe.syncing:
        named = ", ".join(f"{k} at {v}" for k, v in probe.syncing.items())
        return failed(f"host sync in {named}{missing}")
    detail = (f"{len(probe.checked)} calls sync-free under set_sync_debug_mode('error'): "
              f"{', '.join(probe.checked)}")
    return (skipped if runtime is None else passed)(detail + missing)


# -- 5. head_timing ------------------------------------------------------------------------------------


def policy_crossover(shape: Shape) -> str:
    """Smallest batch (one row per request, no overlap between vocabularies) for which
    nanospec.policy.choose_head picks the full head."""
    from nanospec.policy import choose_head

    elem = torch.finfo(shape.dtype).bits // 8
    limit = 10 * max(1, shape.vocab // shape.w_max) + 100  # the break-even is near V / W
    for b in range(1, limit + 1):
        if choose_head(batch=b, rows=b, vocab=shape.vocab, w_max=shape.w_max, dim=shape.dim, elem=elem,
                       union_size=b * shape.w_max) == "full":
            return f"B={b}"
    return f"packed up to B={limit}"


def measured_crossover(batches: list[int], packed: list[float], full: list[float]) -> str:
    """Where the full head becomes at least as fast as the packed one, interpolated linearly."""
    diff = [p - f for p, f in zip(packed, full, strict=True)]  # > 0: full is faster
    for i, d in enumerate(diff):
        if d >= 0:
            if i == 0:
                return f"<= {batches[0]}"
            b0, b1, d0 = batches[i - 1], batches[i], diff[i - 1]
            return f"~{b0 + (b1 - b0) * -d0 / (d - d0):.1f} (between {b0} and {b1})"
    return f"> {batches[-1]} (packed faster at every batch)"


def time_heads(shape: Shape, batches: list[int], ctx: Ctx) -> tuple[list[float], list[float]]:
    """Median times in ms of Proposer.logits forced "packed" and "full", one row per request, with
    every window full (W active tokens per request: the policy's assumption)."""
    from nanospec.proposer import Proposer

    dev = ctx.device
    weight = make_weight(shape, dev, seed=500)
    cfg = NanoSpecConfig(k_pre=K_PRE, w_max=shape.w_max)
    heads = {k: Proposer(weight, shape.slots, cfg, head=k) for k in ("packed", "full")}
    g = torch.Generator().manual_seed(501)
    for slot in range(max(batches)):
        heads["packed"].dv.start(slot, torch.randperm(shape.vocab, generator=g)[: shape.w_max].to(dev))
    heads["packed"].dv.wait_gathers()
    timer = gpu_median_ms if ctx.cuda else cpu_median_ms
    out: dict[str, list[float]] = {"packed": [], "full": []}
    for b in batches:
        hidden = torch.randn(b, shape.dim, device=dev).to(shape.dtype)
        reqs = torch.arange(b, device=dev)
        for kind, head in heads.items():
            out[kind].append(timer(lambda h=head, x=hidden, r=reqs: h.logits(x, r)))
    return out["packed"], out["full"]


def check_head_timing(ctx: Ctx) -> Outcome:
    """Check 5: packed vs full head time over batch sizes, and the policy's crossover."""
    if ctx.cuda:
        shape, batches, label = LLAMA3, TIMING_BATCHES, "GPU ms (CUDA events, median of 50)"
    else:
        shape, batches = DRY_TIMING_SHAPE, [1, 4, 16]
        label = "CPU ms (dry run: tiny sizes, not GPU figures; median of 7)"
    packed, full = time_heads(shape, batches, ctx)
    rows = " ".join(f"B{b} {p:.3f}/{f:.3f}" for b, p, f in zip(batches, packed, full, strict=True))
    return passed(f"{label}, {shape.label()} {str(shape.dtype).removeprefix('torch.')}, windows full, "
                  f"packed/full: {rows}; measured crossover {measured_crossover(batches, packed, full)}; "
                  f"policy predicts {policy_crossover(shape)} (no overlap)")


# -- 6. memory -------------------------------------------------------------------------------------------


def layout_nbytes(shape: Shape) -> dict[str, int]:
    """Bytes of every DynamicVocab buffer as docs/core.md lays them out (2-D arrays carry one spare
    element, the packed buffer one spare row)."""
    cd = 2 if shape.w_max <= 32767 else 4
    elem = torch.finfo(shape.dtype).bits // 8
    rw = shape.slots * shape.w_max + 1
    return {"col_of": (shape.slots * shape.vocab + 1) * cd, "col_tok": rw * 4, "count": rw * cd,
            "ring": rw * cd, "stack": rw * cd, "nfree": shape.slots * 4, "pos": shape.slots * 8,
            "gathered": shape.slots * 8, "packed": rw * shape.dim * elem}


def nbytes_mismatch(nb: dict[str, int], shape: Shape) -> str | None:
    want = layout_nbytes(shape)
    got = {k: v for k, v in nb.items() if k not in ("total", "per_request")}
    if got != want:
        return f"nbytes() {got} differs from the layout {want}"
    return None


def describe_nbytes(nb: dict[str, int], slots: int) -> str:
    book = (nb["total"] - nb["packed"]) / slots
    return (f"nbytes total {nb['total'] / 2**20:.1f} MiB = packed {nb['packed'] / 2**20:.1f} MiB + "
            f"bookkeeping {book:,.0f} B/request ({nb['per_request'] / 1e6:.2f} MB/request in all)")


def memory_workload(dv: DynamicVocab, shape: Shape, dev: torch.device) -> None:
    """Start every slot and run 50 full-batch steps (temporaries of start/extend)."""
    traffic = Traffic(shape.vocab, shape.w_max, 601, 40)
    for slot in range(shape.slots):
        start_full(dv, slot, traffic, dev)
    reqs = torch.arange(shape.slots, device=dev)
    for _ in range(50):
        dv.extend(reqs, traffic.tokens(shape.slots, 40).to(dev),
                  torch.ones(shape.slots, 40, dtype=torch.bool, device=dev))
    settle(dev, dv)


def check_memory(ctx: Ctx) -> Outcome:
    """Check 6: device memory of the state and packed buffer for 48 slots vs DynamicVocab.nbytes()."""
    shape, cfg = LLAMA3, NanoSpecConfig(k_pre=K_PRE, w_max=LLAMA3.w_max)
    if not ctx.cuda:
        # Meta tensors: the real sizes without allocating 1.2 GB on the CPU.
        meta = torch.empty(shape.vocab, shape.dim, dtype=shape.dtype, device="meta")
        nb = DynamicVocab(meta, shape.slots, cfg).nbytes()
        bad = nbytes_mismatch(nb, shape)
        return failed(bad) if bad else passed(
            f"dry run, nbytes only ({shape.label()} bf16): {describe_nbytes(nb, shape.slots)}, matches the "
            "layout of docs/core.md")
    weight = make_weight(shape, ctx.device, seed=600)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    dv = DynamicVocab(weight, shape.slots, cfg, check_inputs=False)
    torch.cuda.synchronize()
    held, build_peak = torch.cuda.memory_allocated() - base, torch.cuda.max_memory_allocated() - base
    memory_workload(dv, shape, ctx.device)
    work_peak = torch.cuda.max_memory_allocated() - base
    nb = dv.nbytes()
    slack = 16 * 1024  # the caching allocator rounds every block up to 512 bytes
    detail = (f"{describe_nbytes(nb, shape.slots)}; allocated {held - nb['total']:+d} B vs nbytes, peak "
              f"while building {build_peak - nb['total']:+d} B, peak over 48 starts + 50 steps "
              f"{(work_peak - nb['total']) / 2**20:+.1f} MiB (start/extend temporaries)")
    bad = nbytes_mismatch(nb, shape)
    if bad or not 0 <= held - nb["total"] <= slack or build_peak - nb["total"] > slack:
        return failed(f"{bad or 'allocation differs from nbytes() by more than 16 KiB'}: {detail}")
    return passed(detail)


# -- driver --------------------------------------------------------------------------------------------

CHECKS: list[tuple[str, Callable[[Ctx], Outcome]]] = [
    ("imports", check_imports),
    ("loop", check_loop),
    ("kernels_match", check_kernels),
    ("cuda_graph_heads", check_cuda_graphs),
    ("side_stream_race", check_side_stream_race),
    ("no_host_sync", check_no_host_sync),
    ("head_timing", check_head_timing),
    ("memory", check_memory),
]


def run_check(fn: Callable[[Ctx], Outcome], ctx: Ctx) -> Outcome:
    """Run one check; an exception is a FAIL naming it; the check's wall time goes on the line."""
    if ctx.time_left() <= 0:
        return skipped("time budget used up (--budget)")
    t0 = time.monotonic()
    try:
        out = fn(ctx)
    except Exception as e:  # a crashing check is a failed check; the others still run
        out = failed(describe(e))
    finally:
        gc.collect()
        if ctx.cuda:
            torch.cuda.empty_cache()
    out.seconds = time.monotonic() - t0
    out.detail += f" [{out.seconds:.1f} s]"
    return out


def header(ctx: Ctx) -> str:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    if ctx.cuda:
        device = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    else:
        device = f"CPU {platform.machine()} {os.cpu_count()} cores"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"gpu_check {now} mode={'cuda' if ctx.cuda else 'dry'} torch={torch.__version__} "
            f"triton={triton_version} python={platform.python_version()} device=\"{device}\" "
            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', 'unset')}")


def run(checks: list[tuple[str, Callable[[Ctx], Outcome]]], ctx: Ctx, emit: Callable[[str], None],
        results: dict | None = None) -> int:
    """Run the checks, emitting the header, one line per check and a summary; 1 if any FAILed.
    ``results`` (if given) receives the header, each check's outcome and the summary."""
    t0 = time.monotonic()
    head = header(ctx)
    emit(head)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    outcomes = {}
    for name, fn in checks:
        out = run_check(fn, ctx)
        counts[out.status] += 1
        outcomes[name] = out
        emit(f"{out.status} {name}: {out.detail}")
    summary = (f"gpu_check: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP in "
               f"{time.monotonic() - t0:.1f} s")
    emit(summary)
    if results is not None:
        results.update(header=head, summary=summary,
                       checks={n: dataclasses.asdict(o) for n, o in outcomes.items()})
    return 1 if counts["FAIL"] else 0


def markdown(results: dict) -> str:
    """The Markdown report: header, one table row per check, the loop's times as a table."""
    lines = ["# gpu_check", "", f"`{results['header']}`", "", results["summary"], "",
             "| check | status | seconds | detail |", "|---|---|---|---|"]
    for name, o in results["checks"].items():
        lines.append(f"| {name} | {o['status']} | {o['seconds']:.1f} | {o['detail'].replace('|', '/')} |")
    times = results["checks"].get("loop", {}).get("data", {}).get("times", {})
    for batch, t in times.items():
        lines += ["", f"Loop check times, {batch} (ms; ratio to the full head):", "",
                  "| part | ms | vs full head |", "|---|---|---|"]
        lines += [f"| {k} | {v['ms']:.4f} | {v['vs_full_head']:.3f} |" for k, v in t.items()]
    return "\n".join(lines) + "\n"


def interpreter_on() -> bool:
    """Whether Triton kernels can run on the CPU (TRITON_INTERPRET=1 was set before triton loaded)."""
    from nanospec import kernels

    try:
        kernels.load("triton", torch.device("cpu"))
    except (ImportError, ValueError):
        return False
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = [n for n, _ in CHECKS]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry", action="store_true", help="CPU-only reduced run (automatic without CUDA)")
    p.add_argument("--out", type=Path, help="directory for gpu_check.json and gpu_check.md (and .txt lines)")
    p.add_argument("--only", type=lambda s: s.split(","), default=names,
                   help=f"comma-separated subset of {names}")
    p.add_argument("--budget", type=float, default=420.0,
                   help="seconds (default keeps a GPU run under 8 minutes); later checks SKIP once used up")
    p.add_argument("--inject-fault", action="store_true",
                   help="self-test: corrupt the PyTorch twin's state once so that kernels_match must FAIL")
    p.add_argument("--plant-stale-rows", action="store_true",
                   help="self-test: the loop's gathers skip every other row; the loop check must FAIL")
    p.add_argument("--narrow-rows", action="store_true",
                   help="kernels_match leaves out rows with more distinct candidates than W (in-step "
                        "eviction; only tiny windows see them in serving)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.only) - set(names))
    if unknown:
        p.error(f"unknown checks {unknown}; known: {names}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and not args.dry
    if cuda and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("gpu_check: unset TRITON_INTERPRET for the CUDA run (it would interpret every kernel)",
              file=sys.stderr)
        return 2
    if not cuda:
        torch.set_num_threads(1)  # small sizes; keeps a shared CPU usable
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 references must be float32
    ctx = Ctx(cuda=cuda, interpret=interpreter_on(), inject_fault=args.inject_fault,
              plant_stale=args.plant_stale_rows, wide_rows=not args.narrow_rows,
              deadline=time.monotonic() + args.budget)
    checks = [(n, fn) for n, fn in CHECKS if n in args.only]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.txt").write_text("")
    results: dict = {}

    def emit(line: str) -> None:
        print(line, flush=True)
        if args.out:  # line by line: a run cut short still leaves its lines
            with (args.out / "gpu_check.txt").open("a", encoding="utf-8") as f:
                f.write(line + "\n")

    rc = run(checks, ctx, emit, results)
    if args.out:
        (args.out / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
        (args.out / "gpu_check.md").write_text(markdown(results))
    return rc


if __name__ == "__main__":
    sys.exit(main())
