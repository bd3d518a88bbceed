"""Sweep the draft tree for a target and draft on this host, through the real SGLang server, and show
where NANOSPEC's step controller lands: plain decoding, EAGLE3 and NANOSPEC at every fixed
configuration (steps/topk/draft tokens), EAGLE3 under SGLang's own ``--speculative-adaptive``, and
NANOSPEC with its controller, one after another in one run (``--interleave``: all servers up at once,
taking each question in turn), same questions, greedy.

    python -m nanospec.bench.tune --target smollm2-135m --draft nanospec/drafts/smollm2-135m \\
        --questions ../shared/data/mt_bench/question.jsonl --per-category 1 --max-turns 1 \\
        --configs 1/1/2,2/1/3,3/1/4 --out docs/results/tune_smollm2

Prints and writes (tune.json, tune.md, tune.png in --out) the tok/s, speed-up over AR and accepted
tokens per step of every configuration, the ratios that matter (the controller over AR, over EAGLE3's
best fixed configuration, over SGLang's adaptive EAGLE3), and the controller's learned cost model:
acceptance per draft depth, the measured cycle time at each step count and the tokens per second it
expects from each, which says why it chose what it chose.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nanospec.bench import specbench
from nanospec.bench.specbench import Method


def parse_config(text: str) -> tuple[int, int, int]:
    """"steps/topk/draft_tokens", e.g. "3/1/4"."""
    try:
        steps, topk, tokens = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a configuration is steps/topk/draft_tokens, e.g. 3/1/4; "
                                         f"got {text!r}") from None
    if steps < 1 or topk < 1 or tokens < 2:
        raise argparse.ArgumentTypeError(f"configuration {text!r}: steps and topk >= 1, draft tokens >= 2")
    return steps, topk, tokens


def spec_args(steps: int, topk: int, tokens: int) -> list[str]:
    return ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(tokens)]


def methods(draft: Path, configs: list[tuple[int, int, int]], with_fixed_nanospec: bool) -> list[Method]:
    """AR; EAGLE3 at each config; EAGLE3 adaptive (SGLang's); NANOSPEC at each config (fixed chain);
    NANOSPEC with the controller over the longest chain among the configs."""
    def spec(algo: str, cfg, env=None, extra=()):
        return ["--speculative-algorithm", algo, "--speculative-draft-model-path", str(draft),
                *spec_args(*cfg), *extra], {**specbench.TIME_DRAFT_ENV, **(env or {})}

    chain = max((c for c in configs if c[1] == 1), default=(3, 1, 4))
    out = [Method("ar")]
    out += [Method(f"eagle3 {s}/{k}/{t}", *spec("EAGLE3", (s, k, t))) for s, k, t in configs]
    out.append(Method("eagle3 adaptive", *spec("EAGLE3", chain, extra=("--speculative-adaptive",))))
    if with_fixed_nanospec:
        out += [Method(f"nanospec {s}/{k}/{t}", *spec("NANOSPEC", (s, k, t), {"NANOSPEC_STEPS": "fixed"}))
                for s, k, t in configs]
    out.append(Method("nanospec controller", *spec("NANOSPEC", chain)))
    return out


def ratios(summary: dict) -> dict:
    """The controller's tok/s over AR, over EAGLE3's best fixed configuration and over EAGLE3 adaptive."""
    tok = {m: s["overall"]["tok_s"] for m, s in summary.items()}
    eagle_fixed = {m: v for m, v in tok.items() if m.startswith("eagle3 ") and m != "eagle3 adaptive"}
    best = max(eagle_fixed, key=eagle_fixed.get) if eagle_fixed else None
    ctl = tok.get("nanospec controller")
    out = {"best_eagle3_fixed": best}
    if ctl:
        out["controller_vs_ar"] = ctl / tok["ar"] if tok.get("ar") else None
        out["controller_vs_best_eagle3_fixed"] = ctl / tok[best] if best else None
        out["controller_vs_eagle3_adaptive"] = (ctl / tok["eagle3 adaptive"]
                                                if tok.get("eagle3 adaptive") else None)
    return out


def cost_model_markdown(report: dict | None, ar_ms_per_token: float | None) -> str:
    """The controller's learned model per batch-size bucket, as a table."""
    if not report or not report.get("buckets"):
        return "(the controller logged no report: fewer than 50 decode cycles)\n"
    lines = []
    for bs, b in report["buckets"].items():
        acc = ", ".join(f"{a:.2f}" for a in b["accept_per_depth"])
        lines += [f"batch-size bucket {bs}: acceptance per draft depth [{acc}]; chose k={b['choice']}; "
                  f"cycles run per k {b['ran']}", "",
                  "| k | E(k) tokens / cycle | cycle ms at the last speed | cycle / 0-step cycle | "
                  "draft ms | verify ms | expected tok/s |"
                  + (" cycle / AR token |" if ar_ms_per_token else ""),
                  "|---|---|---|---|---|---|---|" + ("---|" if ar_ms_per_token else "")]
        plain = b["cycle_ms"].get("0", b["cycle_ms"].get(0))
        for k, e in b["expected_tokens"].items():
            c = b["cycle_ms"].get(k)
            ratio = (f" {c / ar_ms_per_token:.2f} |" if c and ar_ms_per_token else
                     (" - |" if ar_ms_per_token else ""))
            lines.append(f"| {k} | {e:.2f} | {specbench._fmt(c, '.1f')} | "
                         f"{specbench._fmt(c / plain if c and plain else None, '.2f')} | "
                         f"{specbench._fmt(b['draft_ms'].get(k), '.1f')} | "
                         f"{specbench._fmt(b['verify_ms'].get(k), '.1f')} | "
                         f"{specbench._fmt(b['tok_per_s'].get(k), '.2f')} |{ratio}")
        lines.append("")
    lines.append(f"controller decision time: {report['decide_us']:.0f} us per decode cycle")
    return "\n".join(lines) + "\n"


def markdown(summary: dict, r: dict, report: dict | None, ar_ms: float | None, meta: dict) -> str:
    rows = ["| configuration | runs | tok/s | vs AR | accepted / step | = AR |", "|---|---|---|---|---|---|"]
    for m, cats in summary.items():
        s = cats["overall"]
        eq = "-" if s["equal_ar"] is None else ("yes" if s["equal_ar"] else f"no ({s['mismatches']})")
        rows.append(f"| {m} | {s.get('config') or ''} | {s['tok_s']:.2f} | "
                    f"{specbench._fmt(s.get('speedup'), '.2f', 'x')} | "
                    f"{specbench._fmt(s['accept'], '.2f')} | {eq} |")
    fmt = lambda v: specbench._fmt(v, ".3f", "x")  # noqa: E731
    head = [f"{Path(meta['target']).name}, draft {meta['draft']}, {meta['questions']}, greedy", "",
            *rows, "",
            f"- NANOSPEC controller vs AR: {fmt(r.get('controller_vs_ar'))}",
            f"- vs EAGLE3's best fixed configuration ({r.get('best_eagle3_fixed')}): "
            f"{fmt(r.get('controller_vs_best_eagle3_fixed'))}",
            "- vs EAGLE3 under SGLang's --speculative-adaptive: "
            f"{fmt(r.get('controller_vs_eagle3_adaptive'))}",
            "", "The controller's cost model (its last report in the server log):", ""]
    return "\n".join(head) + "\n" + cost_model_markdown(report, ar_ms)


def plot(summary: dict, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    vals = [summary[m]["overall"]["tok_s"] for m in names]
    colors = ["#888" if m == "ar" else "#4c72b0" if m.startswith("eagle3") else "#dd8452" for m in names]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(names)), 3.8))
    ax.bar(range(len(names)), vals, color=colors)
    if "ar" in summary:
        ax.axhline(summary["ar"]["overall"]["tok_s"], color="#444", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("output tokens/s")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="model-zoo name (nanospec.models) or directory")
    ap.add_argument("--draft", type=Path, required=True, help="EAGLE-3 draft directory")
    ap.add_argument("--questions", help="Spec-Bench jsonl (default: the MT-bench questions shipped)")
    ap.add_argument("--num-questions", type=int)
    ap.add_argument("--per-category", type=int)
    ap.add_argument("--categories", help="comma-separated categories to keep")
    ap.add_argument("--max-turns", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--configs", type=lambda s: [parse_config(c) for c in s.split(",") if c.strip()],
                    default=[(1, 1, 2), (2, 1, 3), (3, 1, 4)],
                    help="comma-separated steps/topk/draft_tokens swept for EAGLE3 and NANOSPEC")
    ap.add_argument("--no-fixed-nanospec", action="store_true",
                    help="leave out NANOSPEC at the fixed configurations (the controller still runs)")
    ap.add_argument("--interleave", action="store_true",
                    help="all servers up at once, every configuration answering each question before the "
                    "next (specbench --interleave): ratios free of the host's drift, for the memory of all")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for the servers")
    ap.add_argument("--server-args", default="")
    ap.add_argument("--out", type=Path, default=Path("tune_out"))
    return ap.parse_args(argv)


def run_all(ms: list[specbench.Method], interleave: bool, target: str, base: list[str], env: dict[str, str],
            tokenizer, questions: list[dict], max_new_tokens: int, max_turns: int, logs: Path) -> list[dict]:
    """Every method's run: one server after another, or all side by side (``specbench.run_interleaved``)."""
    if interleave:
        runs = specbench.run_interleaved(ms, target, base, env, tokenizer, questions, max_new_tokens,
                                         max_turns, logs)
    else:
        runs = []
        for m in ms:
            print(f"[tune] {m.name}: starting server", flush=True)
            runs.append(specbench.run_method(m, target, base, env, tokenizer, questions, max_new_tokens,
                                             max_turns, logs))
    for r in runs:
        tok, wall = sum(x["completion_tokens"] for x in r["records"]), sum(x["wall_s"] for x in r["records"])
        print(f"[tune] {r['method']}: {tok / wall:.2f} tok/s ({r['config']})", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoTokenizer

    from nanospec.data import load_questions
    from nanospec.models import resolve

    a = parse_args(argv)
    specbench.stop_on_sigterm()
    questions = load_questions(specbench.find_questions(a.questions), a.num_questions, a.per_category,
                               a.categories.split(",") if a.categories else None)
    target = resolve(a.target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = a.dtype or ("float32" if device == "cpu" else "auto")
    base = specbench.base_server_args(device, dtype, a.server_args)
    env = {"OMP_NUM_THREADS": str(a.threads)} if a.threads else {}
    runs = run_all(methods(a.draft, a.configs, not a.no_fixed_nanospec), a.interleave, target, base, env,
                   tokenizer, questions, a.max_new_tokens, a.max_turns, a.out / "logs")
    summary = specbench.summarize(runs, draft_ref="")
    r = ratios(summary)
    ar = summary.get("ar", {}).get("overall")
    ar_ms = 1e3 * ar["wall_s"] / ar["tokens"] if ar and ar["tokens"] else None
    report = next((x["steps_report"] for x in runs if x["method"] == "nanospec controller"), None)
    meta = {"target": str(target), "draft": str(a.draft), "device": device, "dtype": dtype,
            "questions": f"{len(questions)} questions x {a.max_turns} turns, {a.max_new_tokens} new tokens",
            "configs": ["/".join(map(str, c)) for c in a.configs], "threads": a.threads,
            "interleave": a.interleave, "argv": sys.argv[1:]}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "tune.json").write_text(json.dumps({"meta": meta, "summary": summary, "ratios": r,
                                                 "cost_model": report, "runs": runs}, indent=1))
    text = markdown(summary, r, report, ar_ms, meta)
    (a.out / "tune.md").write_text(text)
    plot(summary, a.out / "tune.png", f"{Path(target).name}: {meta['questions']}")
    print(text)
    print(f"wrote {a.out / 'tune.json'}, {a.out / 'tune.md'}, {a.out / 'tune.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
