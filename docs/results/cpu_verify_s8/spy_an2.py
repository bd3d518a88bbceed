import sys, collections, re
path = sys.argv[1]; musts = sys.argv[2].split("|"); top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
tot = 0; incl = collections.Counter(); all_ = 0
for line in open(path):
    stack, n = line.rsplit(" ", 1); n = int(n); all_ += n
    frames = [re.sub(r":\d+\)", ")", f) for f in stack.split(";")]
    idx = [next((j for j, f in enumerate(frames) if m in f), None) for m in musts]
    if None in idx: continue
    tot += n
    for f in set(frames[idx[-1]:]): incl[f] += n
print("all", all_, "selected", tot, f"{100*tot/all_:.1f}%")
for f, n in incl.most_common(top): print(f"{n:6d} {100*n/tot:5.1f}%  {f[:140]}")
