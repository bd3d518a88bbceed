"""Where a server's scheduler spent its time, from spy.py's py-spy samples (200 a second): each sample
goes to the first part whose frame is on its stack; ms per generated token.

    python3 docs/results/cpu_costs/cycle_spy/parts.py runs/spy/*_?.txt
"""
import collections
import json
import sys
from pathlib import Path

PARTS = [("draft-extend forward", ("_draft_extend_for_decode", "ModelRunner.forward ")),
         ("draft-step forwards", ("Worker.draft ", "ModelRunner.forward ")),
         ("draft prefill forward", ("_draft_extend_for_prefill", "ModelRunner.forward ")),
         ("target forward passes", "ModelRunner.forward "), ("NanoSpec after_verify", "Runtime.after_verify"),
         ("NanoSpec gap-fill stash", "GapFill.stash"), ("SGLang trivial verify input", "_build_trivial_verify_input"),
         ("SGLang verify outside the forward", "run_eagle_verify"),
         ("draft-extend outside the forward", "_draft_extend_for_decode"),
         ("draft steps outside the forward", "Worker.draft ")]
OTHER = "the rest (scheduler loop, AR's sampling, waits)"
names = [n for n, _ in PARTS] + [OTHER]
print("| run | tok/s | samples | " + " | ".join(names) + " | all but the target's forward passes |")
print("|---|---|---|" + "---|" * (len(names) + 1))
for p in sys.argv[1:]:
    total, ms = 0, collections.Counter()
    for line in open(p):
        line = line.rstrip()
        if not line:
            continue
        stack, n = line.rsplit(" ", 1)
        total += int(n)
        ms[next((name for name, key in PARTS
                 if all(k in stack for k in ((key,) if isinstance(key, str) else key))), OTHER)] += int(n)
    tokens, wall, tok_s = json.loads((Path(p).parent / "res.json").read_text())[Path(p).stem]
    ms = {k: v / 200 / tokens * 1000 for k, v in ms.items()}
    print(f"| {p} | {tok_s:.2f} | {total} | " + " | ".join(f"{ms.get(n, 0):.2f}" for n in names)
          + f" | {sum(v for k, v in ms.items() if k != 'target forward passes'):.2f} |")
