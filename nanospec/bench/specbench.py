"""Spec-Bench-style serving benchmark: AR, EAGLE3, EAGLE3 with a static top-N head, NANOSPEC (+ ablations).

For each method in turn it starts a real SGLang server (start, warm up, measure, stop; with
``--interleave`` all servers at once, every method answering a question before the next), answers every
question of a Spec-Bench-format jsonl file (``{"question_id", "category", "turns": [...]}``) one request
at a time, greedy, multi-turn as Spec-Bench does (turn 2's prompt holds turn 1's question and this
method's own answer, rendered with the target's chat template, or as plain "User:/Assistant:" text when
the target has none), and reports per method and category: output tokens/s end to end (client wall
time), speed-up over AR, mean accepted tokens per verify step (``completion_tokens / spec_verify_ct``
from SGLang's ``meta_info``), mean active draft vocabulary (``nanospec_mean_active_vocab``), and whether
every output equals AR's token for token; per method overall also the median draft step time (SGLang's
``EagleDraftWorker.draft``, timed inside each speculative server run with ``NANOSPEC_TIME_DRAFT=1``: the
last ``NANOSPEC timing`` line of its log, the median over all its draft calls, which one-off compiles in
the first calls and load spikes on a shared host hardly move) and, when
EAGLE3 ran, the draft step speed-up over EAGLE3's (EAGLE3's draft step time / this method's).

    python -m nanospec.bench.specbench --target smollm2-135m --draft runs/smol/final \\
        --questions ../shared/data/mt_bench/question.jsonl --per-category 1 --max-new-tokens 128 \\
        --out docs/results/specbench
    # tiny random models (V = 32768, d = 512) built in DIR and used as --target / --draft:
    python -m nanospec.bench.specbench --make-tiny /tmp/nanospec_tiny --vocab 32768 --hidden 512 \\
        --methods eagle3,nanospec --max-turns 1 --num-questions 3 --max-new-tokens 48 --ignore-eos

Writes ``specbench.json`` (summary and every request), ``specbench.md`` and ``specbench.png`` to --out,
and the server logs and static draft to ``--work-dir`` (default OUT/work). The static head is the
draft's head pruned to the N most frequent training tokens (FR-Spec-style, ``nanospec.draft_format``, as
``python -m nanospec.train.export --top-n N`` does) unless ``--static-draft`` names one; a draft with no
training token counts (e.g. a --make-tiny one) gets the N most frequent tokens of the benchmark's own
prompts instead (then the lowest ids), an optimistic choice for the static baseline that the output says.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from nanospec import draft_format as fmt
from nanospec.bench.server import Server
from nanospec.data import load_questions, packaged_questions

ALL_METHODS = ("ar", "ar-repeat", "eagle3", "eagle3-adaptive", "eagle3-static", "nanospec", "nanospec-fixed",
               "nanospec-static", "nanospec-context", "nanospec-extension", "nanospec-indexed")
# "ar-repeat": a second plain-decoding server, measured like the others: its ratio to "ar" is the
# noise floor of the run (two identical servers on the same host), per category and overall.
PLAIN_METHODS = ("ar", "ar-repeat")
# Methods served with the static top-N draft: EAGLE3 over it (FR-Spec) and NANOSPEC over it (the dynamic
# vocabulary intersected with the static head's rows).
STATIC_METHODS = ("eagle3-static", "nanospec-static")
DEFAULT_METHODS = "ar,eagle3,eagle3-static,nanospec"
# Plugin settings of the ablation methods (seed paper, Table 5); "nanospec" is both sources, async gather.
# "nanospec" runs the cost-aware step controller (the default); "nanospec-fixed" the whole chain every step.
ABLATION_ENV = {"nanospec": {}, "nanospec-fixed": {"NANOSPEC_STEPS": "fixed"},
                "nanospec-context": {"NANOSPEC_SOURCES": "context"},
                "nanospec-extension": {"NANOSPEC_SOURCES": "extension"},
                "nanospec-indexed": {"NANOSPEC_GATHER": "indexed"}}
# Every speculative server times its draft step (the plugin's DraftTimer, loaded for EAGLE3 runs too).
TIME_DRAFT_ENV = {"NANOSPEC_TIME_DRAFT": "1"}
STEPS_RE = re.compile(r"NANOSPEC steps report: (\{.*\})")
SGLANG_ADAPTIVE_RE = re.compile(r"Adaptive spec params updated: steps (\d+) -> (\d+)")
TIMING_RE = re.compile(r"NANOSPEC timing: draft step ([0-9.]+) ms median, [0-9.]+ ms mean over (\d+) calls")
PROMPT_HEAD_NOTE = ("static top-{n} head chosen from the benchmark's own prompts (their most frequent "
                    "tokens, then the lowest ids) as the draft has no training token counts: an optimistic "
                    "choice for the static baseline")


@dataclass
class Method:
    name: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


# -- questions and prompts ----------------------------------------------------------------------------

def find_questions(path: str | None) -> Path:
    """The question file: ``path`` if given, else the MT-bench questions shipped in nanospec/data."""
    if path:
        p = Path(path)
        if not p.is_file():
            raise SystemExit(f"question file not found: {p}")
        return p
    return packaged_questions()


def render(tokenizer, turns: list[str], answers: list[str]) -> list[int]:
    """Prompt ids for the next turn: every earlier question with its answer, then ``turns[len(answers)]``."""
    messages = []
    for i, q in enumerate(turns[: len(answers) + 1]):
        messages.append({"role": "user", "content": q})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    text = "".join(f"{'User' if m['role'] == 'user' else 'Assistant'}: {m['content']}\n" for m in messages)
    return tokenizer(text + "Assistant:")["input_ids"]


# -- running one method ---------------------------------------------------------------------------------

def answer_all(generate, tokenizer, questions: list[dict], max_new_tokens: int, max_turns: int) -> list[dict]:
    """Answers every question turn by turn with ``generate(input_ids) -> SGLang /generate response``."""
    records = []
    for q in questions:
        answers: list[str] = []
        for turn in range(min(len(q["turns"]), max_turns)):
            ids = render(tokenizer, q["turns"], answers)
            t0 = time.perf_counter()
            r = generate(ids)
            wall = time.perf_counter() - t0
            m = r["meta_info"]
            answers.append(r["text"])
            records.append({"question_id": q["question_id"], "category": q["category"], "turn": turn + 1,
                            "prompt_tokens": len(ids), "output_ids": list(r.get("output_ids") or []),
                            "completion_tokens": m["completion_tokens"], "wall_s": wall,
                            "verify_ct": m.get("spec_verify_ct"),
                            "active_vocab": m.get("nanospec_mean_active_vocab"),
                            "hit_rate": m.get("nanospec_hit_rate"), "text": r["text"]})
    return records


def log_path(log_dir: Path, method: Method) -> Path:
    # "eagle3 3/1/4" -> eagle3_3_1_4.log
    return log_dir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", method.name) + ".log")


def start_server(method: Method, target: str, base_args: list[str], env: dict[str, str], tokenizer,
                 questions: list[dict], log_dir: Path) -> tuple[Server, float]:
    """A started and warmed-up server for ``method`` and its start-up seconds; the caller stops it."""
    t0 = time.perf_counter()
    srv = Server(target, base_args + method.args, {**env, **method.env}, log_path(log_dir, method)).start()
    started = time.perf_counter() - t0
    try:  # warm-up outside the measurement: first-call allocations and lazy init
        srv.generate(render(tokenizer, questions[0]["turns"], []), 8)
    except BaseException:
        srv.stop()
        raise
    return srv, started


def method_result(method: Method, log_dir: Path, started: float, records: list[dict]) -> dict:
    """One method's run: its records plus what its server log says (draft step, controller report)."""
    text = log_path(log_dir, method).read_text(errors="replace")
    # AR has no draft step; a speculative server that never reached 10 draft calls logged no timing.
    draft_ms = draft_ms_from_log(text) if method.name not in PLAIN_METHODS else None
    steps = steps_report_from_log(text)
    return {"method": method.name, "startup_s": started, "draft_ms": draft_ms, "records": records,
            "config": method_config(method, text, steps), "steps_report": steps}


def run_method(method: Method, target: str, base_args: list[str], env: dict[str, str], tokenizer,
               questions: list[dict], max_new_tokens: int, max_turns: int, log_dir: Path,
               ignore_eos: bool = False) -> dict:
    srv, started = start_server(method, target, base_args, env, tokenizer, questions, log_dir)
    with srv:
        records = answer_all(lambda ids: srv.generate(ids, max_new_tokens, ignore_eos), tokenizer,
                             questions, max_new_tokens, max_turns)
    return method_result(method, log_dir, started, records)


def run_interleaved(methods: list[Method], target: str, base_args: list[str], env: dict[str, str], tokenizer,
                    questions: list[dict], max_new_tokens: int, max_turns: int, log_dir: Path,
                    ignore_eos: bool = False) -> list[dict]:
    """Every method's server up at once, idle ones asleep (``--sleep-on-idle``), and each question
    answered by every method before the next one, the first method rotating question by question.
    A shared host's speed drifts by 10-30 % over minutes; servers run one after another each meet a
    different host, servers run side by side meet the same one."""
    args = base_args + ([] if "--sleep-on-idle" in base_args else ["--sleep-on-idle"])
    records: dict[str, list[dict]] = {m.name: [] for m in methods}
    started: dict[str, float] = {}
    with ExitStack() as stack:
        servers = {}
        for m in methods:
            print(f"[specbench] {m.name}: starting server", flush=True)
            srv, started[m.name] = start_server(m, target, args, env, tokenizer, questions, log_dir)
            servers[m.name] = stack.enter_context(srv)
        for i, q in enumerate(questions):
            for m in methods[i % len(methods):] + methods[: i % len(methods)]:
                generate = partial(servers[m.name].generate, max_new_tokens=max_new_tokens,
                                   ignore_eos=ignore_eos)
                records[m.name] += answer_all(generate, tokenizer, [q], max_new_tokens, max_turns)
    return [method_result(m, log_dir, started[m.name], records[m.name]) for m in methods]


def steps_report_from_log(text: str) -> dict | None:
    """The last ``NANOSPEC steps report`` of a server log (the step controller's learned cost model,
    logged every 100 decode cycles), or None."""
    found = STEPS_RE.findall(text)
    return json.loads(found[-1]) if found else None


def method_config(method: Method, log_text: str, steps: dict | None) -> str:
    """What a method ran, for the tables: "plain decoding", a fixed chain or tree
    ("steps 3, topk 1, 4 draft tokens"), SGLang's adaptive steps with the step counts it moved
    between, or NanoSpec's controller with the share of cycles at each step count."""
    if not method.args:
        return "plain decoding"
    flags = dict(zip(method.args[::2], method.args[1::2], strict=False))
    tree = (f"steps {flags.get('--speculative-num-steps')}, topk {flags.get('--speculative-eagle-topk')}, "
            f"{flags.get('--speculative-num-draft-tokens')} draft tokens")
    if "--speculative-adaptive" in method.args:
        seen = sorted({int(k) for pair in SGLANG_ADAPTIVE_RE.findall(log_text) for k in pair})
        return f"SGLang adaptive (steps {seen if seen else 'never moved'})"
    if steps is not None:
        from nanospec.controller import steps_mix

        return f"controller: {steps_mix(steps)}"
    return tree


def draft_ms_from_log(text: str) -> float | None:
    """The median X of the last ``NANOSPEC timing: draft step X ms median, Y ms mean over N calls`` line
    of a server log (running statistics, so the last line covers the most calls), or None."""
    found = TIMING_RE.findall(text)
    return float(found[-1][0]) if found else None


# -- metrics ------------------------------------------------------------------------------------------

def summarize(runs: list[dict], ref: str = "ar", draft_ref: str = "eagle3") -> dict:
    """Per method and category (plus "overall"): tokens, wall time, tok/s, speed-up over ``ref``, mean
    accepted tokens per verify step, mean active vocabulary, and output equality with ``ref``; "overall"
    also holds the method's ``draft_ms`` (None for AR or when its log had no timing) and, when
    ``draft_ref`` ran, ``draft_speedup`` = ``draft_ref``'s draft_ms / this method's."""
    by_name = {r["method"]: r for r in runs}
    ref_out = ({(x["question_id"], x["turn"]): x["output_ids"] for x in by_name[ref]["records"]}
               if ref in by_name else None)
    out: dict[str, dict] = {}
    for run in runs:
        groups: dict[str, list[dict]] = {}
        for x in run["records"]:
            groups.setdefault(x["category"], []).append(x)
            groups.setdefault("overall", []).append(x)
        out[run["method"]] = {cat: _stats(xs, ref_out) for cat, xs in groups.items()}
    if ref in out:
        for cats in out.values():
            for cat, s in cats.items():
                base = out[ref].get(cat, {}).get("tok_s")
                s["speedup"] = s["tok_s"] / base if base else None
    ref_ms = by_name[draft_ref].get("draft_ms") if draft_ref in by_name else None
    for run in runs:
        overall = out[run["method"]]["overall"]
        overall["draft_ms"] = run.get("draft_ms")
        overall["config"] = run.get("config")
        if draft_ref in by_name:
            ms = overall["draft_ms"]
            overall["draft_speedup"] = ref_ms / ms if ref_ms and ms else None
    return out


def _stats(xs: list[dict], ref_out: dict | None) -> dict:
    tokens = sum(x["completion_tokens"] for x in xs)
    wall = sum(x["wall_s"] for x in xs)
    verify = [x for x in xs if x["verify_ct"]]
    vocab = [x["active_vocab"] for x in xs if x["active_vocab"] is not None]
    # Hit rate: share of emitted tokens that were in the draft's vocabulary when drafted (the plugin's
    # live coverage, draft-tree tokens included), weighted by each request's tokens.
    hits = [x for x in xs if x.get("hit_rate") is not None]
    hit_tokens = sum(x["completion_tokens"] for x in hits)
    accept = (sum(x["completion_tokens"] for x in verify) / sum(x["verify_ct"] for x in verify)
              if verify else None)
    equal = None
    if ref_out is not None:
        mismatches = sum(1 for x in xs if ref_out.get((x["question_id"], x["turn"])) != x["output_ids"])
        equal = mismatches == 0
    return {"requests": len(xs), "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall if wall else 0.0,
            "accept": accept, "active_vocab": sum(vocab) / len(vocab) if vocab else None,
            "hit_rate": (sum(x["hit_rate"] * x["completion_tokens"] for x in hits) / hit_tokens
                         if hit_tokens else None),
            "equal_ar": equal, "mismatches": mismatches if ref_out is not None else None}


def _fmt(v, spec: str, suffix: str = "", none: str = "-") -> str:
    return none if v is None else format(v, spec) + suffix


def markdown(summary: dict, notes: list[str] | tuple[str, ...] = ()) -> str:
    cats = list(next(iter(summary.values())).keys())
    cats = [c for c in cats if c != "overall"] + ["overall"]
    lines = ["| category | method | requests | tokens | tok/s | speed-up vs AR | accepted / step | "
             "mean active vocab | = AR | draft step ms | draft step speed-up vs EAGLE3 | configuration |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for cat in cats:
        for method, per in summary.items():
            s = per.get(cat)
            if s is None:
                continue
            eq = "-" if s["equal_ar"] is None else ("yes" if s["equal_ar"] else f"no ({s['mismatches']})")
            name = f"**{cat}**" if cat == "overall" else cat
            # Draft step time is per method (one server run), so only the overall rows carry it.
            lines.append(f"| {name} | {method} | {s['requests']} | {s['tokens']} | {s['tok_s']:.2f} | "
                         f"{_fmt(s.get('speedup'), '.2f', 'x')} | {_fmt(s['accept'], '.2f')} | "
                         f"{_fmt(s['active_vocab'], '.0f')} | {eq} | {_fmt(s.get('draft_ms'), '.2f')} | "
                         f"{_fmt(s.get('draft_speedup'), '.2f', 'x')} | {s.get('config') or ''} |")
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else [])) + "\n"


def plot(summary: dict, path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(summary)
    cats = [c for c in next(iter(summary.values())) if c != "overall"] + ["overall"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / len(methods)
    panels = ((axes[0], "tok_s", "output tokens/s"), (axes[1], "accept", "accepted tokens / step"))
    for ax, key, label in panels:
        for i, m in enumerate(methods):
            vals = [(summary[m].get(c, {}).get(key) or 0.0) for c in cats]
            ax.bar([j + i * width for j in range(len(cats))], vals, width, label=m)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))])
        ax.set_xticklabels(cats, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_results(summary: dict, runs: list[dict], meta: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "specbench.json", out / "specbench.md", out / "specbench.png"]
    paths[0].write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))
    notes = [f"static draft: {meta['static_head']}"] if meta.get("static_head") else []
    paths[1].write_text(markdown(summary, notes))
    plot(summary, paths[2], f"{Path(meta['target']).name}, {meta['questions']}")
    return paths


# -- methods and drafts ---------------------------------------------------------------------------------

def static_draft(draft: Path, top_n: int, out: Path, token_counts: str | None) -> Path:
    """FR-Spec-style static top-N copy of ``draft`` (cached in ``out``): its head keeps the ``top_n`` most
    frequent training tokens of ``token_counts`` (default: the run directory's), EOS forced in."""
    if (out / fmt.CONFIG_NAME).is_file() and (out / fmt.WEIGHTS_NAME).is_file():
        return out
    counts = token_counts or fmt.find_token_counts(draft)
    try:
        if counts is None:
            raise fmt.DraftFormatError(f"no {fmt.TOKEN_COUNTS_NAME} beside {draft}")
        return fmt.static_top_n(draft, out, top_n, fmt.load_token_counts(counts))
    except ValueError as e:
        raise SystemExit(f"static top-{top_n} export failed: {e}\n"
                         "give --token-counts RUN/token_counts.safetensors or --static-draft DIR") from e


def find_token_counts(draft: Path, given: str | None) -> Path | None:
    """Training token counts for the static export: ``given``, else ``token_counts.safetensors`` where
    ``draft_format.find_token_counts`` (and nanospec.train.export) looks, else None."""
    if given:
        if not Path(given).is_file():
            raise SystemExit(f"--token-counts {given} not found")
        return Path(given)
    return fmt.find_token_counts(draft)


def prompt_token_counts(tokenizer, questions: list[dict], max_turns: int, vocab_size: int):
    """(vocab_size,) int64 counts of each id in the benchmark's prompts: every turn sent, rendered as a
    first-turn prompt so that the chat template's tokens count too."""
    import torch

    counts = torch.zeros(vocab_size, dtype=torch.long)
    for q in questions:
        for turn in q["turns"][:max_turns]:
            ids = torch.tensor(render(tokenizer, [turn], []), dtype=torch.long)
            counts += torch.bincount(ids[ids < vocab_size], minlength=vocab_size)
    return counts


def prompt_static_draft(draft: Path, top_n: int, out: Path, counts) -> Path:
    """FR-Spec-style copy of the full-vocabulary EAGLE-3 ``draft`` in ``out`` whose head keeps the
    ``top_n`` ids of ``counts`` (V,) (EOS forced in, as nanospec.train.export does):
    ``lm_head.weight`` [top_n, H], ``d2t`` [top_n] (kept id minus draft id, SGLang's format),
    ``t2d`` [V] bool, and config ``draft_vocab_size = top_n``."""
    try:
        return fmt.static_top_n(draft, out, top_n, counts)
    except ValueError as e:
        raise SystemExit(f"{e}; give --static-draft DIR") from e


def choose_static_draft(a: argparse.Namespace, tokenizer, questions: list[dict],
                        work: Path) -> tuple[Path, str]:
    """The static top-N draft and how its head was chosen (printed and kept in the JSON meta)."""
    if a.static_draft:
        return a.static_draft, "given (--static-draft)"
    vocab = json.loads((a.draft / "config.json").read_text())["vocab_size"]
    n = min(a.static_top_n, vocab)
    exported = work / f"draft_static_top{n}"
    counts = find_token_counts(a.draft, a.token_counts)
    if counts is not None or (exported / "model.safetensors").is_file():
        how = f"static top-{n} head of the most frequent training tokens ({counts or 'cached'})"
        return static_draft(a.draft, n, exported, str(counts) if counts else None), how
    counts = prompt_token_counts(tokenizer, questions, a.max_turns, vocab)
    return prompt_static_draft(a.draft, n, work / f"draft_static_top{n}_prompts", counts), \
        PROMPT_HEAD_NOTE.format(n=n)


def make_methods(names: list[str], draft: Path | None, static: Path | None,
                 spec_args: list[str]) -> list[Method]:
    methods = []
    for name in names:
        if name in PLAIN_METHODS:
            methods.append(Method(name))
            continue
        path = static if name in STATIC_METHODS else draft
        algo = "EAGLE3" if name.startswith("eagle3") else "NANOSPEC"
        args = ["--speculative-algorithm", algo, "--speculative-draft-model-path", str(path), *spec_args]
        if name == "eagle3-adaptive":
            args.append("--speculative-adaptive")  # SGLang's own accept-length rule, its default config
        methods.append(Method(name, args, {**TIME_DRAFT_ENV, **ABLATION_ENV.get(name, {})}))
    return methods


def check_drafts(a: argparse.Namespace, target: str | Path) -> None:
    """Stop before any server starts when a draft the methods need is missing, truncated or made for
    another target (vocabulary or hidden size; checked when ``target`` is a local directory)."""
    drafted = any(m not in (*PLAIN_METHODS, *STATIC_METHODS) for m in a.methods)
    needed = [("--draft", a.draft)] if drafted else []
    if set(STATIC_METHODS) & set(a.methods):
        needed.append(("--static-draft", a.static_draft) if a.static_draft else ("--draft", a.draft))
    for flag, path in needed:
        try:
            fmt.check_draft_dir(path, target if Path(target).is_dir() else None)
        except fmt.DraftFormatError as e:
            raise SystemExit(f"{flag}: {e}") from e


def base_server_args(device: str, dtype: str, extra: str) -> list[str]:
    args = ["--device", device, "--dtype", dtype, "--skip-server-warmup", "--max-running-requests", "4"]
    if device == "cpu":
        # The nanospec.cpu hook gives CPU runs their backend and KV bound; keep the KV pool small on shared
        # hosts.
        # No CUDA graphs on CPU (SGLang skips them there by device, except in the per-step runtime states
        # of adaptive speculative decoding, which would fail to build them).
        args += ["--attention-backend", "intel_amx", "--max-total-tokens", "8192", "--disable-cuda-graph"]
    return args + extra.split()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="model-zoo name (nanospec.models), directory or hub id")
    ap.add_argument("--draft", type=Path, help="full-vocabulary EAGLE-3 draft directory")
    ap.add_argument("--make-tiny", type=Path, metavar="DIR",
                    help="build a tiny random Llama target + EAGLE-3 draft in DIR (reused when already "
                    "there) and use them as --target / --draft")
    ap.add_argument("--vocab", type=int, default=32768, help="vocabulary size of the --make-tiny models")
    ap.add_argument("--hidden", type=int, default=512, help="hidden size of the --make-tiny models")
    ap.add_argument("--static-draft", type=Path, help="static top-N draft (default: exported from --draft)")
    ap.add_argument("--static-top-n", type=int, default=32000, help="N of the static head (capped at V)")
    ap.add_argument("--token-counts", help="token_counts.safetensors for the static export "
                    "(default: the draft's run directory's)")
    ap.add_argument("--questions", help="Spec-Bench jsonl (default: the 80 MT-bench questions shipped in "
                    "nanospec/data)")
    ap.add_argument("--num-questions", type=int)
    ap.add_argument("--per-category", type=int)
    ap.add_argument("--categories", help="comma-separated categories to keep")
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    ap.add_argument("--interleave", action="store_true",
                    help="all servers up at once (idle ones asleep), every method answering each question "
                    "before the next: ratios not skewed by the host's speed drifting between servers")
    ap.add_argument("--methods", default=DEFAULT_METHODS,
                    help=f"comma-separated, from {','.join(ALL_METHODS)}")
    ap.add_argument("--spec-steps", type=int, default=3)
    ap.add_argument("--spec-topk", type=int, default=1)
    ap.add_argument("--spec-draft-tokens", type=int, default=4)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="server --dtype (default: float32 on CPU, auto on GPU)")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the servers")
    ap.add_argument("--server-args", default="", help="more sglang.launch_server arguments")
    ap.add_argument("--out", type=Path, default=Path("specbench_out"))
    ap.add_argument("--work-dir", type=Path, help="server logs and the static draft (default: OUT/work)")
    a = ap.parse_args(argv)
    a.methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    bad = [m for m in a.methods if m not in ALL_METHODS]
    if bad:
        ap.error(f"unknown method(s) {bad}; choose from {', '.join(ALL_METHODS)}")
    if a.make_tiny:
        if a.target or a.draft:
            ap.error("--make-tiny builds the target and the draft: leave out --target and --draft")
        if a.vocab < 300:
            ap.error("--vocab must be at least 300 (the tiny tokenizer's 256 bytes, specials and merges)")
        if a.hidden <= 0 or a.hidden % 8:
            ap.error("--hidden must be a positive multiple of 8 (the tiny target has 8 attention heads)")
        return a
    if a.target is None:
        ap.error("give --target (and --draft), or --make-tiny DIR")
    if any(m not in PLAIN_METHODS for m in a.methods) and a.draft is None and not (
            set(a.methods) <= {*PLAIN_METHODS, *STATIC_METHODS} and a.static_draft):
        ap.error("speculative methods need --draft (a full-vocabulary EAGLE-3 draft directory)")
    return a


def run(a: argparse.Namespace, tokenizer=None) -> tuple[dict, list[dict], list[Path]]:
    import torch
    from transformers import AutoTokenizer

    from nanospec.models import resolve

    try:
        questions = load_questions(find_questions(a.questions), a.num_questions, a.per_category,
                                   a.categories.split(",") if a.categories else None)
    except ValueError as e:
        raise SystemExit(str(e)) from e
    if a.make_tiny:
        from nanospec.testing import make_tiny

        print(f"[specbench] tiny random target + EAGLE-3 draft (V={a.vocab}, d={a.hidden}) in {a.make_tiny}",
              flush=True)
        tiny_target, a.draft = make_tiny(a.make_tiny, a.vocab, a.hidden)
        a.target = str(tiny_target)
    target = resolve(a.target)
    check_drafts(a, target)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(target)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = a.dtype or ("float32" if device == "cpu" else "auto")
    static, static_head = a.static_draft, None
    work = a.work_dir or a.out / "work"
    if set(STATIC_METHODS) & set(a.methods):
        static, static_head = choose_static_draft(a, tokenizer, questions, work)
        print(f"[specbench] static draft: {static_head} ({static})", flush=True)
    spec = ["--speculative-num-steps", str(a.spec_steps), "--speculative-eagle-topk", str(a.spec_topk),
            "--speculative-num-draft-tokens", str(a.spec_draft_tokens)]
    env = {"OMP_NUM_THREADS": str(a.threads)} if a.threads else {}
    methods = make_methods(a.methods, a.draft, static, spec)
    base, logs = base_server_args(device, dtype, a.server_args), work / "logs"
    if a.interleave:
        runs = run_interleaved(methods, target, base, env, tokenizer, questions, a.max_new_tokens,
                               a.max_turns, logs, a.ignore_eos)
        for r in runs:
            print_run(r)
    else:
        runs = []
        for m in methods:
            print(f"[specbench] {m.name}: starting server", flush=True)
            runs.append(run_method(m, target, base, env, tokenizer, questions, a.max_new_tokens, a.max_turns,
                                   logs, a.ignore_eos))
            print_run(runs[-1])
    summary = summarize(runs)
    tiny = {"dir": str(a.make_tiny), "vocab": a.vocab, "hidden": a.hidden} if a.make_tiny else None
    meta = {"target": str(target), "draft": str(a.draft), "static_draft": str(static),
            "static_head": static_head, "make_tiny": tiny,
            "draft_ms": "median EagleDraftWorker.draft wall time per speculative server "
                        "(NANOSPEC_TIME_DRAFT=1; over all its draft calls, from its log's last timing line)",
            "questions": f"{len(questions)} questions x {a.max_turns} turns, {a.max_new_tokens} new tokens",
            "methods": a.methods, "device": device, "dtype": dtype, "spec": spec, "threads": a.threads,
            "ignore_eos": a.ignore_eos, "interleave": a.interleave, "argv": sys.argv[1:]}
    return summary, runs, write_results(summary, runs, meta, a.out)


def print_run(r: dict) -> None:
    tok = sum(x["completion_tokens"] for x in r["records"])
    wall = sum(x["wall_s"] for x in r["records"])
    draft = f", draft step {r['draft_ms']:.2f} ms" if r["draft_ms"] is not None else ""
    print(f"[specbench] {r['method']}: {tok} tokens in {wall:.1f} s ({tok / wall:.2f} tok/s){draft}, "
          f"server start {r['startup_s']:.0f} s", flush=True)


def stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the running server's process group is stopped on the way out."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    stop_on_sigterm()
    _, _, paths = run(a)
    print(paths[1].read_text())  # the Markdown table, with the static head's note
    print("wrote " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
