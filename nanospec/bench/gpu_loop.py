"""The loop check of ``nanospec.bench.gpu_check``: NanoSpec's draft side driven the way SGLang drives it,
with torch and triton only.

Per round, on a forward stream that is not the default one (as SGLang's scheduler runs):

1. a verify stand-in: random accepted paths and target logits, then an eager ``Proposer.after_verify``
   whose gathers of newly active rows run on the side stream;
2. a draft-extend: hidden rows of the accepted tokens (each row close to its token's head row, as a
   draft's next prediction is close to recent context), the last row of each request selected
   *before* the head, then logits, softmax and top-k;
3. draft steps replayed from CUDA graphs captured once per padded batch size (replayed with fewer live
   requests, the padding rows on a slot that is never started), after ``wait_gathers``.

Every step's token ids are compared with an eager reference: the full draft head in float32,
restricted to the request's active vocabulary, top-k, mapped to target ids. A stale packed row (a
gather not waited for, or skipped) puts a wrong logit on a token the next hidden state points at, so
it changes the ids. Ids may differ only at near-ties of the reference (float32 sums in another order).

Without CUDA (``--dry``) the same loop runs on the CPU at small sizes, in float32, eagerly (no graphs,
no streams).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nanospec import NanoSpecConfig
from nanospec.proposer import Proposer

TIE_TOL = 1e-4  # ids may differ where reference logits are this close (relative to the row's max |logit|)
SLEEP_CYCLES = 100_000_000  # torch.cuda._sleep: ~50 ms, the host queues all timed calls behind it


@dataclass(frozen=True)
class LoopShape:
    """Sizes of the loop: target vocabulary, draft head rows (reduced: fewer, through a hot map),
    hidden size, window, largest batch, CUDA-graph batch sizes, draft rows per request (top-k of the
    tree), draft steps per round, verified tree tokens per request."""

    vocab: int
    draft_vocab: int
    dim: int
    w_max: int
    batches: tuple[int, ...]
    topk: int = 4
    steps: int = 3
    tree: int = 8
    dtype: torch.dtype = torch.bfloat16

    @property
    def slots(self) -> int:  # the last one is the padding slot, never started
        return max(self.batches) + 1


LLAMA3_LOOP = LoopShape(128_256, 32_000, 4096, 3072, (1, 2, 4, 8))
DRY_LOOP = LoopShape(4096, 1024, 64, 256, (1, 2, 4), dtype=torch.float32)


@dataclass
class LoopStats:
    rounds: int = 0
    compared: int = 0  # token ids compared
    near_ties: int = 0
    starts: int = 0
    batch_sizes: set = field(default_factory=set)
    mismatch: str | None = None


def make_weight(rows: int, dim: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    """A random LM head [rows, dim] whose rows have norm ~1."""
    g = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(rows, dim, generator=g, device=device, dtype=torch.float32)
    return w.mul_(dim**-0.5).to(dtype)


def capture(fn: Callable[[], object], pool=None) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm ``fn`` up on a side stream, then capture it in a CUDA graph; returns the graph and fn's
    outputs, which every replay overwrites."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def gpu_median_ms(fn: Callable[[], object], reps: int = 50, warmup: int = 5) -> float:
    """Median GPU time of fn in ms from CUDA events, the GPU held busy while the host queues the calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    torch.cuda._sleep(SLEEP_CYCLES)
    for a, b in events:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def cpu_median_ms(fn: Callable[[], object], reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


class Drafter:
    """One draft model stand-in around a Proposer: a residual tanh layer as the backbone, the
    proposer's head, softmax and top-k (the work of one SGLang draft step)."""

    def __init__(self, prop: Proposer, shape: LoopShape, seed: int):
        dev = prop.device
        self.prop, self.shape = prop, shape
        g = torch.Generator(device=dev).manual_seed(seed)
        self.layer = (torch.randn(shape.dim, shape.dim, generator=g, device=dev) * shape.dim**-0.5).to(
            shape.dtype)

    def step(self, hidden: torch.Tensor, reqs: torch.Tensor):
        """hidden [B*G, d] -> (the backbone's output [B*G, d], which the head reads and the next step
        starts from; top-k probs [B*G, k] float32; their target ids [B*G, k])."""
        hidden = hidden + 0.5 * torch.tanh(hidden @ self.layer)
        out = self.prop.logits(hidden, reqs)
        top = torch.softmax(out.logits, dim=-1).topk(self.shape.topk, dim=-1)
        return hidden, top.values, out.token_ids(top.indices)

    def steps(self, hidden: torch.Tensor, reqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """All draft steps of a round: (the hidden each step's head read [S, B*G, d], ids [S, B*G, k])."""
        seen, ids = [], []
        for _ in range(self.shape.steps):
            hidden, _, tok = self.step(hidden, reqs)
            seen.append(hidden)
            ids.append(tok)
        return torch.stack(seen), torch.stack(ids)


def reference_ids(prop: Proposer, w32: torch.Tensor, hidden: torch.Tensor, slots: torch.Tensor,
                  k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager reference: (target ids [N, k] of the top-k of the full float32 head restricted to each
    row's slot's active draft rows, the restricted logits [N, V_d]); slots [N] one per row."""
    logits = hidden.float() @ w32.T
    v_d = logits.shape[1]
    active = torch.zeros(logits.shape[0], v_d + 1, dtype=torch.bool, device=logits.device)
    toks = prop.dv.column_tokens()[slots].long()
    active.scatter_(1, torch.where(toks >= 0, toks, v_d), True)  # free columns mark the spare column
    logits = logits.masked_fill_(~active[:, :v_d], float("-inf"))
    rows = logits.topk(k, dim=-1).indices
    return (rows if prop.hot is None else prop.hot[rows]), logits


def compare_ids(prop: Proposer, got: torch.Tensor, ref: torch.Tensor, ref_logits: torch.Tensor,
                stats: LoopStats) -> str | None:
    """None if got [N, k] equals ref [N, k], or differs only at near-ties of the reference."""
    stats.compared += got.numel()
    diff = got != ref
    if not bool(diff.any()):
        return None
    rows = got.clamp_min(0) if prop.t2d is None else prop.t2d[got.clamp(0, prop.t2d.shape[0] - 1)]
    got_l = ref_logits.gather(1, rows.clamp_min(0)).masked_fill_(rows < 0, float("-inf"))
    ref_l = ref_logits.gather(1, prop.t2d[ref] if prop.t2d is not None else ref)
    scale = ref_logits.masked_fill(torch.isneginf(ref_logits), 0).abs().amax(1, keepdim=True)
    far = diff & ((got_l - ref_l).abs() > TIE_TOL * scale)
    stats.near_ties += int((diff & ~far).sum())
    if not bool(far.any()):
        return None
    r, j = (int(x) for x in far.nonzero()[0])
    return (f"{int(far.sum())} of {got.numel()} token ids differ from the reference (row {r}, place {j}: "
            f"got {int(got[r, j])} logit {float(got_l[r, j]):.4f}, reference {int(ref[r, j])} logit "
            f"{float(ref_l[r, j]):.4f})")


class Traffic:
    """Prompts, verify results and hidden states for the loop, from one seed (on the host, then copied)."""

    def __init__(self, prop: Proposer, shape: LoopShape, w: torch.Tensor, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.prop, self.shape, self.w = prop, shape, w
        hot = prop.hot.cpu() if prop.hot is not None else torch.arange(shape.vocab)
        self.hot = hot
        self.t2d = prop.t2d.cpu() if prop.t2d is not None else None

    def tokens(self, *size: int) -> torch.Tensor:
        """Target ids [*size]: 90 % ids the draft head has rows for, the rest any id."""
        inside = self.hot[torch.randint(0, len(self.hot), size, generator=self.g)]
        anyid = torch.randint(0, self.shape.vocab, size, generator=self.g)
        return torch.where(torch.rand(size, generator=self.g) < 0.9, inside, anyid)

    def prompt(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = int(torch.randint(8, 2 * self.shape.w_max, (), generator=self.g))
        return self.tokens(n), self.tokens(n, self.prop.cfg.k_pre)

    def verify(self, b: int) -> dict[str, torch.Tensor]:
        """Proposer.after_verify arguments for b requests (host tensors)."""
        t, s1 = self.shape.tree, self.shape.steps + 1
        lens = torch.randint(1, s1 + 1, (b,), generator=self.g)
        pos = torch.arange(s1)
        index = torch.where(pos[None, :] < lens[:, None], torch.arange(b)[:, None] * t + pos[None, :], -1)
        predict = self.tokens(b * t)
        logits = torch.randn(b * t, self.shape.vocab, generator=self.g)
        logits[torch.arange(b * t), predict] = 10.0  # the target's verified token is its argmax
        return {"draft_tokens": self.tokens(b * t), "accept_index": index, "accept_lens": lens,
                "predict": predict, "logits": logits}

    def extend_hidden(self, predict: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Draft-extend hidden rows [sum(lens), d] (host, float32): each accepted token's head row
        scaled up (its own row, where the draft head has one) plus noise."""
        b, t = lens.shape[0], self.shape.tree
        toks = torch.cat([predict[i * t: i * t + int(lens[i])] for i in range(b)])
        rows = toks if self.t2d is None else self.t2d[toks]
        own = self.w[rows.clamp_min(0).to(self.w.device)].float().cpu() * 4.0
        own[rows < 0] = 0.0
        return own + torch.randn(own.shape, generator=self.g)


@dataclass
class Graphs:
    """Draft-step graphs by padded batch size: static inputs and outputs (eager callables on the CPU)."""

    replay: dict[int, Callable[[], object]]
    hidden: dict[int, torch.Tensor]  # [P*G, d] input of the first step
    reqs: dict[int, torch.Tensor]  # [P] slots, padding on the spare slot
    out: dict[int, tuple[torch.Tensor, torch.Tensor]]  # (inputs seen by each step's head, ids)


def build_graphs(drafter: Drafter, cuda: bool) -> Graphs:
    shape, dev = drafter.shape, drafter.prop.device
    pad = shape.slots - 1
    g = Graphs({}, {}, {}, {})
    pool = torch.cuda.graph_pool_handle() if cuda else None
    for p in sorted(shape.batches, reverse=True):  # largest first: the others reuse its pool
        g.hidden[p] = torch.zeros(p * shape.topk, shape.dim, dtype=shape.dtype, device=dev)
        g.reqs[p] = torch.full((p,), pad, dtype=torch.long, device=dev)

        def body(p: int = p):
            return drafter.steps(g.hidden[p], g.reqs[p])

        if cuda:
            graph, g.out[p] = capture(body, pool)
            g.replay[p] = graph.replay
        else:
            def run(p: int = p, body=body) -> None:
                g.out[p] = body()

            g.replay[p] = run
    return g


def one_round(drafter: Drafter, graphs: Graphs, traffic: Traffic, w32: torch.Tensor, live: list[int],
              stats: LoopStats) -> str | None:
    """Verify stand-in + after_verify, draft-extend, graph draft steps; compare every step."""
    prop, shape, dev = drafter.prop, drafter.shape, drafter.prop.device
    b = len(live)
    reqs = torch.tensor(live, device=dev)
    ver = traffic.verify(b)
    prop.after_verify(reqs=reqs, **{k: v.to(dev) for k, v in ver.items()})
    # Draft-extend: every accepted token has a hidden row; only each request's last goes to the head.
    ext = traffic.extend_hidden(ver["predict"], ver["accept_lens"]).to(dev, shape.dtype)
    last = ver["accept_lens"].cumsum(0).to(dev) - 1
    sel = ext.index_select(0, last)
    out = prop.logits(sel, reqs)
    ids = out.token_ids(torch.softmax(out.logits, dim=-1).topk(shape.topk, dim=-1).indices)
    ref, ref_l = reference_ids(prop, w32, sel, reqs, shape.topk)
    bad = compare_ids(prop, ids, ref, ref_l, stats)
    if bad:
        return f"draft-extend: {bad}"
    # Draft steps at the smallest captured size that holds the batch; the rest is padding.
    p = min(x for x in shape.batches if x >= b)
    stats.batch_sizes.add((b, p))
    g = shape.topk
    graphs.reqs[p][:b] = reqs
    noise = 0.3 * torch.randn(b * g, shape.dim, device=dev)
    graphs.hidden[p][: b * g] = sel.repeat_interleave(g, 0) + noise.to(shape.dtype)
    prop.wait_gathers()
    graphs.replay[p]()
    seen, step_ids = graphs.out[p]
    rows_req = reqs.repeat_interleave(g)
    for s in range(shape.steps):
        ref, ref_l = reference_ids(prop, w32, seen[s, : b * g], rows_req, shape.topk)
        bad = compare_ids(prop, step_ids[s, : b * g], ref, ref_l, stats)
        if bad:
            return f"draft step {s} (batch {b} on the graph of {p}): {bad}"
    return None


def lifecycle(prop: Proposer, traffic: Traffic, live: list[int], shape: LoopShape, stats: LoopStats) -> None:
    """Finish a request now and then and start new ones: the batch size wanders over 1..max."""
    dev, n = prop.device, shape.slots - 1
    if len(live) > 1 and float(torch.rand((), generator=traffic.g)) < 0.3:
        prop.release(live.pop(int(torch.randint(0, len(live), (), generator=traffic.g))))
    free = [s for s in range(n) if s not in live]
    if free and (not live or float(torch.rand((), generator=traffic.g)) < 0.3):
        slot = free[int(torch.randint(0, len(free), (), generator=traffic.g))]
        prompt, topk = traffic.prompt()
        prop.start(slot, prompt.to(dev), topk.to(dev))
        live.append(slot)
        stats.starts += 1


class SkipGather:
    """Stands in for a kernel module whose gather drops every other row: stale packed rows (a
    self-test of the loop check, ``--plant-stale-rows``)."""

    def __init__(self, ops):
        self._ops = ops

    def __getattr__(self, name: str):
        return getattr(self._ops, name)

    def gather(self, weight, packed_flat, dst, src) -> None:
        dst = dst.reshape(-1).clone()
        dst[1::2] = -1
        self._ops.gather(weight, packed_flat, dst, src.reshape(-1))


def run_loop(shape: LoopShape, reduced: bool, cuda: bool, seconds: float, max_rounds: int,
             plant_stale: bool = False, seed: int = 0, backend: str = "auto") -> LoopStats:
    """Drive one Proposer (full or reduced draft vocabulary; kernels of ``backend``) through rounds
    until ``seconds`` or ``max_rounds``; stats.mismatch names the first difference."""
    dev = torch.device("cuda" if cuda else "cpu")
    v_d = shape.draft_vocab if reduced else shape.vocab
    w = make_weight(v_d, shape.dim, shape.dtype, dev, seed)
    hot = None
    if reduced:
        hot = torch.randperm(shape.vocab, generator=torch.Generator().manual_seed(seed))[:v_d].sort().values
    prop = Proposer(w, shape.slots, NanoSpecConfig(w_max=shape.w_max), head="packed", hot=hot,
                    target_vocab=shape.vocab, backend=backend)
    if plant_stale:
        prop.dv.head.ops = SkipGather(prop.dv.head.ops)
    w32 = w.float()
    stats, live, t0 = LoopStats(), [], time.monotonic()
    fwd = None
    if cuda:  # SGLang's scheduler runs its forward passes on a stream of its own
        fwd = torch.cuda.Stream()
        fwd.wait_stream(torch.cuda.current_stream())  # the weights and buffers made on this one
    with torch.cuda.stream(fwd) if cuda else contextlib.nullcontext():
        drafter = Drafter(prop, shape, seed + 1)
        traffic = Traffic(prop, shape, w, seed + 2)
        graphs = build_graphs(drafter, cuda)
        while stats.rounds < max_rounds and time.monotonic() - t0 < seconds:
            lifecycle(prop, traffic, live, shape, stats)
            stats.mismatch = one_round(drafter, graphs, traffic, w32, live, stats)
            stats.rounds += 1
            if stats.mismatch:
                stats.mismatch = f"round {stats.rounds - 1}: {stats.mismatch}"
                break
    if cuda:
        torch.cuda.synchronize()
    return stats


def time_heads(shape: LoopShape, batch: int, cuda: bool) -> dict[str, float]:
    """ms of the packed and the full head over the whole target vocabulary (no hot map, windows full):
    head alone, head + softmax + top-k (+ ids), and the whole draft step, CUDA graphs on the GPU."""
    dev = torch.device("cuda" if cuda else "cpu")
    w = make_weight(shape.vocab, shape.dim, shape.dtype, dev, seed=9)
    prop = Proposer(w, batch, NanoSpecConfig(w_max=shape.w_max), head="packed")
    g = torch.Generator().manual_seed(10)
    for slot in range(batch):
        prop.start(slot, torch.randperm(shape.vocab, generator=g)[: shape.w_max].to(dev), None)
    prop.wait_gathers()
    drafter = Drafter(prop, shape, 11)
    reqs = torch.arange(batch, device=dev)
    hidden = torch.randn(batch * shape.topk, shape.dim, device=dev).to(shape.dtype)
    k = shape.topk

    def full_topk(h: torch.Tensor):
        return torch.softmax((h @ w.T).float(), dim=-1).topk(k, dim=-1)

    def packed_topk(h: torch.Tensor):
        out = prop.logits(h, reqs)
        top = torch.softmax(out.logits, dim=-1).topk(k, dim=-1)
        return top.values, out.token_ids(top.indices)

    def layer(h: torch.Tensor) -> torch.Tensor:
        return h + 0.5 * torch.tanh(h @ drafter.layer)

    fns = {"full head": lambda: hidden @ w.T, "full head+softmax+top-k": lambda: full_topk(hidden),
           "full draft step": lambda: full_topk(layer(hidden)),
           "packed head": lambda: prop.logits(hidden, reqs),
           "packed head+softmax+top-k": lambda: packed_topk(hidden),
           "packed draft step": lambda: packed_topk(layer(hidden))}
    out = {}
    for name, fn in fns.items():
        if cuda:
            graph, _ = capture(fn)
            out[name] = gpu_median_ms(graph.replay)
        else:
            out[name] = cpu_median_ms(fn)
    return out
