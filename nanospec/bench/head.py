"""Packed draft head vs the full-vocabulary head, measured side by side in one run.

    python -m nanospec.bench.head [--device cpu|cuda] [--dtype float32|float16|bfloat16] [--repeats N]

For each model shape (Llama-3.1-8B, Qwen2.5-0.5B, SmolLM2-135M) and each batch shape (requests x draft
rows per request: 1x1, 1x8 as in a top-8 draft tree level, and 8x1) it prints the full head
(matmul + top-k), the NanoSpec head (packed logits + top-k +
id mapping), one decode step's ``extend`` bookkeeping and its gather of newly active rows, and ratios.
The vocabularies are warmed to a steady state with a Zipf-distributed token stream, so the window is
full and each step evicts and gathers what a real decode step would.

Then, side by side in the same run, the packed head's logits for 1 and for 8 draft rows per request
(min and median of the repeats, interleaved): the head reads each request's active rows once per step
for all of its rows, so 8 rows should cost little more than 1 (``--rows-only`` runs just this part).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from nanospec import DynamicVocab, NanoSpecConfig

SHAPES = {  # name: (vocabulary, hidden size)
    "Llama-3.1-8B": (128256, 4096),
    "Qwen2.5-0.5B": (151936, 896),
    "SmolLM2-135M": (49152, 576),
}


def zipf_tokens(vocab: int, shape: tuple[int, ...], gen: torch.Generator, alpha: float = 1.1) -> torch.Tensor:
    """Token ids [shape] int64 with Zipf(alpha) frequencies over a fixed random ranking of the vocabulary."""
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    probs = ranks.pow(-alpha)
    order = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))
    idx = torch.multinomial(probs, int(torch.tensor(shape).prod()), replacement=True, generator=gen)
    return order[idx].view(shape)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds for one call (synchronising around it on CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def bench_shape(
    name: str, n_req: int, per_req: int, args: argparse.Namespace, device: torch.device
) -> dict[str, float]:
    vocab, dim = SHAPES[name]
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(vocab, dim, generator=gen).to(device=device, dtype=dtype)
    cfg = NanoSpecConfig(w_max=args.w_max)
    dv = DynamicVocab(weight, n_req, cfg, check_inputs=False)
    reqs = torch.arange(n_req, device=device)
    rows = reqs.repeat_interleave(per_req)
    for r in range(n_req):
        prompt = zipf_tokens(vocab, (args.prompt_len,), gen).to(device)
        dv.start(r, prompt, zipf_tokens(vocab, (args.prompt_len, cfg.k_pre), gen).to(device))
    valid = torch.ones(n_req, args.candidates, dtype=torch.bool, device=device)

    def step_tokens() -> torch.Tensor:
        return zipf_tokens(vocab, (n_req, args.candidates), gen).to(device)

    for _ in range(args.warm_steps):  # fill the windows: steady state evicts every step
        dv.extend(reqs, step_tokens(), valid)
    hidden = torch.randn(len(rows), dim, generator=gen).to(device=device, dtype=dtype)
    k = args.topk

    def full() -> None:
        (hidden @ weight.T).topk(k, dim=-1)

    def packed() -> None:
        cols = dv.logits(hidden, reqs, per_req).topk(k, dim=-1).indices
        dv.token_ids(rows, cols)

    times: dict[str, list[float]] = {"full": [], "nanospec": [], "extend": [], "gather": []}
    gathered: list[float] = []
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits every column alike
        times["full"].append(timed(full, device))
        times["nanospec"].append(timed(packed, device))
        cand = step_tokens()
        before = dv.state.gathered.sum()
        work: list[tuple[torch.Tensor, torch.Tensor]] = []

        def extend(c: torch.Tensor = cand, out: list = work) -> None:
            out.append(dv.ops.extend(dv.state, reqs, c, valid))

        times["extend"].append(timed(extend, device))
        dst, src = work[0]

        def gather(d: torch.Tensor = dst, s: torch.Tensor = src) -> None:
            dv.ops.gather(weight, dv.head.packed_flat, d, s)

        times["gather"].append(timed(gather, device))
        gathered.append(float(dv.state.gathered.sum() - before) / n_req)
    med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    med["rows_gathered"] = statistics.mean(gathered)
    med["active"] = float(dv.active_sizes(reqs).float().mean())
    return med


def rows_per_request(name: str, n_req: int, per_req: tuple[int, ...], args: argparse.Namespace,
                     device: torch.device) -> dict[int, tuple[float, float]]:
    """(min, median) ms of the packed head's logits for each count of draft rows per request, and under
    key 0 for the most rows taken one call per row; every window full of distinct tokens (W active rows
    per request), all timed in turn each repeat."""
    vocab, dim = SHAPES[name]
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(vocab, dim, generator=gen).to(device=device, dtype=dtype)
    dv = DynamicVocab(weight, n_req, NanoSpecConfig(w_max=args.w_max), check_inputs=False)
    for r in range(n_req):
        dv.start(r, torch.randperm(vocab, generator=gen)[: args.w_max].to(device))
    reqs = torch.arange(n_req, device=device)
    hidden = {g: torch.randn(n_req * g, dim, generator=gen).to(device=device, dtype=dtype) for g in per_req}
    times: dict[int, list[float]] = {g: [] for g in per_req}
    for g in per_req:  # warm-up
        dv.logits(hidden[g], reqs, g)
    g_max = max(per_req)
    split = [hidden[g_max][i::g_max] for i in range(g_max)]  # row i of every request

    def row_by_row() -> None:  # what reading the rows once per draft row costs: one call per row
        for h in split:
            dv.logits(h, reqs)

    times[0] = []
    for _ in range(args.repeats):
        for g in per_req:
            times[g].append(timed(lambda g=g: dv.logits(hidden[g], reqs, g), device) * 1e3)
        times[0].append(timed(row_by_row, device) * 1e3)
    return {g: (min(t), statistics.median(t)) for g, t in times.items()}


def print_rows_per_request(args: argparse.Namespace, device: torch.device) -> None:
    print(f"\npacked head, draft rows per request side by side (min / median ms of {args.repeats}; "
          f"windows full: {args.w_max} active rows per request)")
    head = (f"{'shape':<14}{'requests':>9}{'rows/req':>14}{'min':>9}{'median':>9}{'min/1row':>10}"
            f"{'med/1row':>10}")
    print(head)
    print("-" * len(head))
    for name in args.shapes:
        for n_req in args.rows_requests:
            t = rows_per_request(name, n_req, (1, 8), args, device)
            for g, (lo, med) in t.items():
                label = str(g) if g else "8, row by row"
                print(f"{name:<14}{n_req:>9}{label:>14}{lo:>9.3f}{med:>9.3f}{lo / t[1][0]:>9.2f}x"
                      f"{med / t[1][1]:>9.2f}x")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: float16 on CUDA, float32 on CPU")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--batches", nargs="+", default=["1x1", "1x8", "8x1"],
                   help="REQUESTSxROWS: requests in the batch and draft rows per request")
    p.add_argument("--w-max", type=int, default=3072)
    p.add_argument("--candidates", type=int, default=35, help="per step: draft tree tokens + top-K_ver")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--warm-steps", type=int, default=120)
    p.add_argument("--topk", type=int, default=4, help="draft top-k taken from either head")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--rows-requests", type=int, nargs="+", default=[1, 4],
                   help="requests in the batch for the rows-per-request comparison")
    p.add_argument("--rows-only", action="store_true", help="only the rows-per-request comparison")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: PyTorch's); 1 is steadier on a machine shared with other jobs")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    args.dtype = args.dtype or ("float16" if device.type == "cuda" else "float32")
    print(f"device={device} dtype={args.dtype} w_max={args.w_max} candidates/step={args.candidates} "
          f"threads={torch.get_num_threads()} repeats={args.repeats} (median ms)")
    if args.rows_only:
        print_rows_per_request(args, device)
        return
    head = (f"{'shape':<14}{'batch':>6}{'full':>10}{'nanospec':>10}{'extend':>9}{'gather':>9}"
            f"{'rows/step':>10}{'active':>8}{'full/ns':>9}{'(ext+ga)/full':>15}")
    print(head)
    print("-" * len(head))
    for name in args.shapes:
        for batch in args.batches:
            n_req, per_req = (int(x) for x in batch.split("x"))
            m = bench_shape(name, n_req, per_req, args, device)
            print(f"{name:<14}{batch:>6}{m['full']:>10.3f}{m['nanospec']:>10.3f}{m['extend']:>9.3f}"
                  f"{m['gather']:>9.3f}{m['rows_gathered']:>10.1f}{m['active']:>8.0f}"
                  f"{m['full'] / m['nanospec']:>8.1f}x{(m['extend'] + m['gather']) / m['full']:>14.1%}")
    print_rows_per_request(args, device)


if __name__ == "__main__":
    main()
