"""docs/results.md's tables and charts, regenerated from the records kept in docs/results/.

    python -m nanospec.bench.report            # rewrite the generated blocks of docs/results.md and the PNGs
    python -m nanospec.bench.report --check    # exit 1 if docs/results.md differs from what the records give

docs/results/records.json names every record a table cites: its file(s), the machine it ran on, the commit
of the code that produced it, and the command that writes it again. docs/results.md holds one block per
table between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``; everything between the markers is
rewritten, everything outside them (the reading of the numbers) is left alone. A record that is missing a
field a table needs is a ``ReportError`` naming the file and the field.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REQUIRED = ("path", "machine", "commit", "command")
CHART_DIR = "charts"  # under docs/results/
METHOD_LABELS = {
    "ar": "AR",
    "eagle3": "EAGLE3",
    "eagle3-adaptive": "EAGLE3, SGLang's --speculative-adaptive",
    "eagle3-static": "EAGLE3, static top-32k head",
    "nanospec": "NANOSPEC",
    "nanospec-fixed": "NANOSPEC, fixed chain",
    "nanospec-static": "NANOSPEC over the static top-32k head",
    "nanospec-context": "NANOSPEC, context only",
    "nanospec-extension": "NANOSPEC, extension only",
    "nanospec-indexed": "NANOSPEC, indexed gather",
}
CPU_PATHS = {
    "old": "SGLang's own (`old`)",
    "gemv": "NanoSpec linear kernel, PyTorch attention (`gemv`)",
    "new": "NanoSpec default (`new`)",
}


class ReportError(ValueError):
    """A record or docs/results.md is not what the report can read; the message names the file."""


# ---- reading records ---------------------------------------------------------------------------------

def load_index(results: Path) -> dict[str, dict[str, Any]]:
    """records.json: {name: {path, machine, commit, command, ...}}, every required field checked."""
    path = results / "records.json"
    index = read_json(path)
    if not isinstance(index, dict):
        raise ReportError(f"{path}: expected an object of records")
    for name, entry in index.items():
        missing = [k for k in REQUIRED if not isinstance(entry, dict) or not entry.get(k)]
        if missing:
            raise ReportError(f"{path}: record {name!r} lacks {', '.join(missing)}")
    return index


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path}: record file missing") from None
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not valid JSON ({e})") from None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise ReportError(f"{path}: record file missing") from None
    out = []
    for i, line in enumerate(lines, 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ReportError(f"{path}:{i}: not valid JSON ({e})") from None
    return out


def field(obj: Any, path: Path, *keys: str | int) -> Any:
    """obj[k0][k1]... or a ReportError naming the file and the missing key."""
    cur = obj
    for k in keys:
        try:
            cur = cur[k]
        except (KeyError, IndexError, TypeError):
            where = "".join(f"[{k!r}]" for k in keys)
            raise ReportError(f"{path}: missing {where}") from None
    return cur


def specbench_overall(path: Path) -> dict[str, dict[str, Any]]:
    """{method: overall summary} of a specbench.json, in the order the methods ran."""
    data = read_json(path)
    methods = field(data, path, "meta", "methods")
    return {m: field(data, path, "summary", m, "overall") for m in methods}


# ---- formatting -------------------------------------------------------------------------------------

def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def num(x: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if x is None else f"{x:,.{digits}f}{suffix}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def yes(x: bool | None) -> str:
    return "-" if x is None else ("yes" if x else "**no**")


def provenance(entry: dict[str, Any], name: str) -> str:
    """The lines every block starts with: record, machine, commit, and the command that writes it."""
    cmd = entry["command"]
    cmds = cmd if isinstance(cmd, list) else [cmd]
    return (f"Record `docs/results/{entry['path']}` (`{name}` in records.json); machine: {entry['machine']}; "
            f"code at commit `{entry['commit']}`. Regenerate the record:\n\n"
            + "\n".join(wrap(c) for c in cmds))


def wrap(cmd: str, width: int = 100) -> str:
    """An indented code line, broken before options with a shell continuation when longer than width."""
    if cmd.startswith("#") or len(cmd) <= width:
        return "    " + cmd
    lines, cur = [], ""
    for part in re.split(r" (?=--|&&|;)", cmd):
        if cur and len(cur) + 1 + len(part) > width:
            lines.append(cur)
            cur = part
        else:
            cur = f"{cur} {part}" if cur else part
    lines.append(cur)
    return "    " + " \\\n        ".join(lines)


# ---- one function per table: (markdown, chart writer or None) ---------------------------------------

Chart = Callable[[Path], None]


ROWS_LINE = re.compile(r"(\S+)\s+(\d+)\s+(\d+(?:, row by row)?)"  # shape, requests, rows per request
                       r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+)x")


def head_block(results: Path, entry: dict[str, Any]) -> tuple[str, Chart | None]:
    """`python -m nanospec.bench.head` stdout: the full/packed table, then (when printed) rows per request."""
    path = results / entry["path"]
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise ReportError(f"{path}: record file missing") from None
    rows, ratios, per_req = [], [], []
    for line in lines:
        parts = line.split()
        m = ROWS_LINE.fullmatch(line.strip())
        if m:
            shape, n_req, label, lo, med, lo_r, med_r = m.groups()
            label = "8, one call per row" if "row by row" in label else label
            per_req.append([shape, n_req, label, lo, med, lo_r + "x", med_r + "x"])
        elif len(parts) == 10 and re.fullmatch(r"\d+x\d+", parts[1]):
            rows.append(parts)
            ratios.append((f"{parts[0]} {parts[1]}", float(parts[8].rstrip("x"))))
    if not rows:
        raise ReportError(f"{path}: no result rows (expected the table nanospec.bench.head prints)")
    md = table(["shape", "requests x rows", "full head ms", "NanoSpec head ms", "extend ms", "gather ms",
                "rows gathered / step", "active vocab", "full / NanoSpec", "(extend + gather) / full"], rows)
    if per_req:
        md += ("\n\nThe packed head with 1 and 8 draft rows per request, every window full, min and median "
               "ms of the repeats, and the 8 rows taken one call per row:\n\n"
               + table(["shape", "requests", "draft rows / request", "min ms", "median ms", "min / 1 row",
                        "median / 1 row"], per_req))

    def chart(out: Path) -> None:
        bars(out, [r[0] for r in ratios], {"full head / NanoSpec head": [r[1] for r in ratios]},
             "times cheaper", "Draft LM head: full vocabulary against the packed active vocabulary")
    return md, chart


def coverage_block(results: Path, entries: list[dict[str, Any]]) -> tuple[str, Chart | None]:
    """coverage.json of nanospec.bench.coverage, one or more models, per category."""
    rows, curves = [], []
    for entry in entries:
        path = results / entry["path"]
        data = read_json(path)
        model = field(data, path, "model")
        cats = field(data, path, "categories")
        for cat, c in cats.items():
            static = field(c, path, "static_coverage")
            bold = cat == "overall"
            cells = [model, cat, str(field(c, path, "tokens")), pct(field(c, path, "nanospec_coverage")),
                     num(field(c, path, "nanospec_mean_vocab"), 0),
                     *(pct(static.get(k)) for k in ("1000", "4000", "16000")),
                     f"{field(c, path, 'static_k_for_same_coverage'):,}"]
            rows.append([f"**{x}**" if bold and i > 0 else x for i, x in enumerate(cells)])
        overall = field(cats, path, "overall")
        sweep = [(s["nanospec_mean_vocab"], s["nanospec_coverage"]) for s in field(overall, path, "sweep")]
        sweep = sorted(sweep + [(overall["nanospec_mean_vocab"], overall["nanospec_coverage"])])  # default k
        static = sorted((int(k), v) for k, v in field(overall, path, "static_coverage").items())
        curves.append((model, static, sweep))
    md = table(["model", "category", "tokens", "NanoSpec coverage", "NanoSpec mean vocab", "static top-1k",
                "static top-4k", "static top-16k", "static K for NanoSpec's coverage"], rows)

    def chart(out: Path) -> None:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        for model, static, sweep in curves:
            line, = ax.plot([k for k, _ in static], [100 * v for _, v in static], "--",
                            label=f"{model}: static top-K")
            ax.plot([v for v, _ in sweep], [100 * c for _, c in sweep], "o-", color=line.get_color(),
                    label=f"{model}: NanoSpec (k = 1, 3, 8, 32)")
        ax.set_xscale("log")
        ax.set_xlabel("draft vocabulary size (tokens)")
        ax.set_ylabel("generated tokens covered (%)")
        ax.set_title("Coverage of generated tokens, MT-bench (Fig. 1b)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, out)
    return md, chart


def mtbench_block(results: Path, entries: list[dict[str, Any]]) -> tuple[str, Chart | None]:
    """specbench.json per target: AR, EAGLE3, static head, NANOSPEC, overall. A record's ``labels``
    renames its methods (a static head of another size)."""
    if isinstance(entries, dict):
        entries = [entries]
    rows, series = [], {}
    for k, entry in enumerate(entries):
        path = results / entry["path"]
        overall = specbench_overall(path)
        eagle = overall.get("eagle3", {}).get("tok_s")
        target = entry.get("label", path.parent.name)
        labels = {**METHOD_LABELS, **entry.get("labels", {})}
        for i, (m, s) in enumerate(overall.items()):
            tok_s = field(s, path, "tok_s")
            rows.append([target if i == 0 else "", labels.get(m, m), num(tok_s),
                         num(field(s, path, "speedup"), 2, "x"),
                         num(tok_s / eagle, 2, "x") if eagle and m != "ar" else "-",
                         num(s.get("accept")), num(s.get("active_vocab"), 0), yes(field(s, path, "equal_ar")),
                         num(s.get("draft_ms"))])
            series.setdefault(labels.get(m, m), [None] * len(entries))[k] = field(s, path, "speedup")
    md = table(["target", "method", "tok/s", "speed-up vs AR", "vs EAGLE3", "accepted / step",
                "mean active vocab", "= AR", "draft step ms"], rows)
    targets = [e.get("label", Path(e["path"]).parent.name) for e in entries]

    def chart(out: Path) -> None:
        bars(out, targets, series, "speed-up over AR (tok/s)",
             "MT-bench through the SGLang server, CPU", ref=1.0)
    return md, chart


def trees_block(results: Path, entry: dict[str, Any]) -> tuple[str, Chart | None]:
    """One specbench.json (EAGLE3 and NANOSPEC) per tree shape, in directories sS_kK_nN."""
    base = results / entry["path"]
    runs = sorted(base.glob("s*_k*_n*/specbench.json"),
                  key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)])
    if not runs:
        raise ReportError(f"{base}: no sS_kK_nN/specbench.json records")
    rows, shapes, acc = [], [], {"EAGLE3": [], "NANOSPEC": []}
    for path in runs:
        overall = specbench_overall(path)
        e, n = field(overall, path, "eagle3"), field(overall, path, "nanospec")
        shape = " / ".join(re.findall(r"\d+", path.parent.name))
        same = same_outputs(path, "eagle3", "nanospec")
        rows.append([shape, num(e["accept"]), num(n["accept"]), pct(n["accept"] / e["accept"]),
                     num(n.get("active_vocab"), 0),
                     f"{num(e.get('draft_ms'), 1)} / {num(n.get('draft_ms'), 1)}", yes(same)])
        shapes.append(shape)
        acc["EAGLE3"].append(e["accept"])
        acc["NANOSPEC"].append(n["accept"])
    md = table(["tree: steps / top-k / draft tokens", "EAGLE3 accepted / step", "NANOSPEC accepted / step",
                "NANOSPEC / EAGLE3", "NANOSPEC active vocab", "draft step ms, EAGLE3 / NANOSPEC",
                "outputs equal"], rows)

    def chart(out: Path) -> None:
        bars(out, shapes, acc, "accepted tokens / verify step",
             "Draft trees, same draft: accepted tokens per step (steps / top-k / draft tokens)")
    return md, chart


def same_outputs(path: Path, a: str, b: str) -> bool:
    """Whether methods a and b of one specbench.json produced the same token ids for every request."""
    data = read_json(path)
    ids = {}
    for run in field(data, path, "runs"):
        ids[run["method"]] = [(r["question_id"], r["turn"], r["output_ids"]) for r in run["records"]]
    if a not in ids or b not in ids:
        raise ReportError(f"{path}: runs of {a!r} and {b!r} expected")
    return ids[a] == ids[b]


def ablation_block(results: Path, entry: dict[str, Any]) -> tuple[str, Chart | None]:
    path = results / entry["path"]
    overall = specbench_overall(path)
    rows = [[METHOD_LABELS.get(m, m), num(field(s, path, "tok_s")), num(field(s, path, "speedup"), 2, "x"),
             num(s.get("accept")), num(s.get("active_vocab"), 0), pct(s.get("hit_rate")),
             yes(field(s, path, "equal_ar")), num(s.get("draft_ms"))] for m, s in overall.items()]
    md = table(["method", "tok/s", "speed-up vs AR", "accepted / step", "mean active vocab", "hit rate",
                "= AR", "draft step ms"], rows)
    return md, None


def cpu_costs_block(results: Path, entry: dict[str, Any]) -> tuple[str, Chart | None]:
    """bench_verify --json: per model and path, decode / verify 4 / verify 8 medians, side-by-side decodes."""
    path = results / entry["path"]
    data = read_json(path)
    if not isinstance(data, list):
        raise ReportError(f"{path}: expected a list of runs")
    rows, series, models = [], {}, []
    for i in range(len(data)):
        model, p = field(data, path, i, "model"), field(data, path, i, "path")
        dec = field(data, path, i, "decode", "median")
        v4, v8 = field(data, path, i, "verify4", "median"), field(data, path, i, "verify8", "median")
        side = field(data, path, i, "decode_vs_paths", "median")
        # speed-up from the decodes of all paths taken in turn, over the model's first path (SGLang's own)
        first = next(x for x in data if x.get("model") == model)
        base = field(first, path, "decode_vs_paths", "median")
        rows.append([model if model not in models else "", CPU_PATHS.get(p, p), num(dec), num(v4), num(v8),
                     num(v4 / dec), num(v8 / dec), num(base / side, 2, "x")])
        if model not in models:
            models.append(model)
        series.setdefault(CPU_PATHS.get(p, p).split(" (")[0], []).append(v4 / dec)
    md = table(["model", "path", "decode ms", "verify 4 ms", "verify 8 ms", "verify 4 / decode",
                "verify 8 / decode", "decode speed-up over SGLang's path"], rows)

    def chart(out: Path) -> None:
        bars(out, models, series, "verify of 4 tokens / decode step",
             "Cost of a 4-token verify in decode steps (CPU, through the server)", ref=1.0)
    return md, chart


def draft_block(results: Path, entry: dict[str, Any]) -> tuple[str, Chart | None]:
    """eval.jsonl of a training run (eval_every): held-out scores along training."""
    path = results / entry["path"]
    evals = read_jsonl(path)
    rows, pts = [], []
    for i, e in enumerate(evals):
        minutes = field(evals, path, i, "train_s") / 60
        est = field(evals, path, i, "accept_length_estimate")
        rows.append([str(field(evals, path, i, "step")), num(minutes, 1), num(e.get("acc_1"), 3),
                     num(e.get("acc_2"), 3), num(e.get("acc_3"), 3), num(est, 3)])
        pts.append((minutes, est))
    md = table(["step", "training minutes", "acc_1", "acc_2", "acc_3", "accept-length estimate"], rows)

    def chart(out: Path) -> None:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([m for m, _ in pts], [e for _, e in pts], "o-")
        ax.set_xlabel("training minutes (2-core CPU)")
        ax.set_ylabel("held-out accept-length estimate")
        ax.set_title("Shipped SmolLM2-135M draft: held-out estimate along training")
        ax.grid(alpha=0.3)
        save(fig, out)
    return md, chart


def steps_block(results: Path, entry: dict[str, Any]) -> tuple[str, Chart | None]:
    """tune.json of ``python -m nanospec.bench.tune``: every configuration, the controller's ratios
    and its learned cost model, rendered by the tool's own Markdown writer."""
    from nanospec.bench import tune

    path = results / entry["path"]
    data = read_json(path)
    summary = field(data, path, "summary")
    ar = summary.get("ar", {}).get("overall")
    ar_ms = 1e3 * ar["wall_s"] / ar["tokens"] if ar and ar.get("tokens") else None
    md = tune.markdown(summary, field(data, path, "ratios"), data.get("cost_model"), ar_ms,
                       field(data, path, "meta")).rstrip()

    def chart(out: Path) -> None:
        tune.plot(summary, out, f"{entry.get('label', path.parent.name)}: tok/s per configuration")
    return md, chart


# name in docs/results.md -> (renderer, record names in records.json)
BLOCKS: dict[str, tuple[Callable[..., tuple[str, Chart | None]], list[str]]] = {
    "head": (head_block, ["head"]),
    "coverage": (coverage_block, ["coverage_smollm2", "coverage_qwen"]),
    "mtbench": (mtbench_block, ["mtbench_smollm2", "mtbench_qwen"]),
    "reduced": (mtbench_block, ["reduced_smollm2_32k", "reduced_smollm2_8k"]),
    "trees": (trees_block, ["trees_smollm2"]),
    "ablation": (ablation_block, ["ablation_smollm2"]),
    "cpu_costs": (cpu_costs_block, ["cpu_costs"]),
    "draft": (draft_block, ["draft_smollm2"]),
    "steps": (steps_block, ["steps_smollm2"]),
    "steps_quick": (steps_block, ["steps_smollm2_quick"]),
    "steps_qwen": (steps_block, ["steps_qwen"]),
}


# ---- charts -----------------------------------------------------------------------------------------

def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110, metadata={"Software": None})  # no version stamp: same records, same bytes
    pyplot().close(fig)


def bars(out: Path, groups: list[str], series: dict[str, list[float | None]], ylabel: str, title: str,
         ref: float | None = None) -> None:
    """Grouped bars: series[label][g] is the bar of group g (None: no bar there)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(series)) / 2), 3.8))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g, v in enumerate(values) if v is not None]
        ax.bar(xs, [v for v in values if v is not None], width, label=label)
    many = len(groups) > 4
    ax.set_xticks(range(len(groups)), groups, rotation=30 if many else 0, ha="right" if many else "center",
                  fontsize=8)
    if ref is not None:
        ax.axhline(ref, color="black", linewidth=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:  # room above the bars for the legend
        ax.set_ylim(0, 1.3 * max(v for vs in series.values() for v in vs if v is not None))
        ax.legend(fontsize=8, ncol=2, loc="upper center")
    save(fig, out)


# ---- docs/results.md ---------------------------------------------------------------------------------

def render_block(name: str, results: Path, index: dict[str, dict[str, Any]]) -> tuple[str, Chart | None]:
    fn, records = BLOCKS[name]
    for r in records:
        if r not in index:
            raise ReportError(f"{results / 'records.json'}: no record {r!r} (table {name!r} needs it)")
    entries = [index[r] for r in records]
    md, chart = fn(results, entries if len(entries) > 1 else entries[0])
    parts = [provenance(index[r], r) for r in records]
    if chart is not None:
        md += f"\n\n![{name}](results/{CHART_DIR}/{name}.png)"
    return "\n\n".join(parts + [md]), chart


def render(doc: str, results: Path, charts: Path | None = None) -> str:
    """doc with every generated block rewritten from the records in results; PNGs into charts if given."""
    index = load_index(results)
    for name in BLOCKS:
        pattern = re.compile(rf"(<!-- report:{name} -->\n)(?:.*?\n)?(<!-- /report:{name} -->)", re.S)
        if not pattern.search(doc):
            raise ReportError(f"docs/results.md: markers <!-- report:{name} --> ... "
                              f"<!-- /report:{name} --> missing")
        body, chart = render_block(name, results, index)
        doc = pattern.sub(lambda m, b=body: m.group(1) + b + "\n" + m.group(2), doc, count=1)
        if charts is not None and chart is not None:
            chart(charts / f"{name}.png")
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path("."), help="repository root (default: .)")
    p.add_argument("--check", action="store_true", help="only compare docs/results.md with the records")
    args = p.parse_args(argv)
    doc_path, results = args.root / "docs" / "results.md", args.root / "docs" / "results"
    doc = doc_path.read_text()
    try:
        new = render(doc, results, None if args.check else results / CHART_DIR)
    except ReportError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != doc:
            print("report: docs/results.md differs from its records; run python -m nanospec.bench.report",
                  file=sys.stderr)
            return 1
        return 0
    doc_path.write_text(new)
    print(f"wrote {doc_path} and {results / CHART_DIR}/*.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
