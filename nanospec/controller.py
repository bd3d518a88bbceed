"""How many draft steps pay: per batch-size bucket, the chain length k (0 = plain decoding) with the
most expected tokens per second of wall time, E(k) / C(k), learned online.

E(k) = 1 + sum_{j=1..k} prod_{d=1..j} a_d, where a_d is the rate at which draft depth d is accepted
given depth d-1 was: a request that drafted k tokens and had n accepted counts depths 1..n as
accepted and depth n+1 as rejected (when n < k); deeper depths were not tried. C(k) is the measured
wall time of a whole decode cycle run with k steps (draft, verify, draft-extend and the scheduler's
own work between two cycles), so whatever a step costs on this host is priced, not modelled.

Only the ratios C(k) / C(j) decide, and a shared host changes every cycle's time at once (this
CPU runs 1.4x slower for spells of tens of cycles), so costs are kept relative to the host's current
speed: the chosen step count's cycles track that speed (a fast average of their log times), and a
cycle with another step count is priced against that speed as it stood just before. Comparing a
plain cycle timed in a slow spell with a drafting cycle timed in a fast one would make drafting look
cheaper than it is; that kept a draft that never paid running in half the cycles (docs/results.md).

Costs and acceptance are forgetting averages, so a bucket follows a workload that changes; a depth
seldom tried leans on a prior (depth 1: ``prior_accept``; deeper: the rate of the depth above).
Until every candidate of a bucket has been timed, the bucket runs the untimed ones in turn; after
that, the bucket probes the other candidates now and then, so a bucket that settled on fewer steps,
or on none, still sees whether deeper drafts have started to land: each is timed again once every
``probe_every`` cycles per other candidate, and up to 8 times as often the nearer its expected speed
to the choice's (within ``NEAR_LOSS``): a near-tie that the warm-up's few noisy cycles decided the
wrong way is put right within tens of cycles, while a candidate that clearly loses costs little. A
candidate's first few relative costs are averaged evenly (one taken during warm-up, at a change of
host speed, does not linger), later ones with weight ``cost_alpha``. A cycle time above ``outlier``
times its expected time counts as that much, so a single stalled cycle moves nothing far.

A 0-step cycle is a plain decode through the verify path, plus the draft's catch-up pass (draft-extend),
which only keeps the draft ready for the next drafting cycle. With ``cold_plain`` (the default) a 0-step
cycle skips that pass (``skip_catch_up``), so falling back to plain decoding costs about what plain
decoding costs; before the next cycle that drafts, one 0-step cycle runs the pass again
(``get_steps_for_batch`` inserts it; ``caught_up`` tells the worker, which leaves its time unpriced: it
is what switching up costs, not what a 0-step cycle costs), so a draft never starts from a skipped
pass's empty state. The skipped tokens' draft KV entries are written late, by that pass
(nanospec/sglang/gapfill.py; the worker runs a pass in a skipped cycle too once it keeps as many skipped
positions as it can, ``skip_catch_up(must_run=True)``), so probes draft from a whole cache. A prefill
does the same (``cold_prefill``) once the bucket its requests will decode in has settled on plain
decoding: it skips the target's top-K_pre and the draft's prefill pass, which serve only drafting, and
leaves the draft behind like a skipped catch-up pass; a request's first token then costs what it costs
without a draft. A draft that never saw a request's prompt accepts less for that request than it would,
so probes on such a request would make drafting look worse than it is and keep the bucket at 0: its
verify results are not counted, and one prefill in ``scout_every`` into a settled bucket still runs
warm, so the probes keep measuring what a draft that saw its prompt accepts. Every prefill runs warm
while drafting is expected within ``scout_near`` of plain decoding's speed: there the probes' next
few results can reverse the choice, and with three prefills in four cold the estimate stood still for
two whole requests of a draft that paid (docs/results.md).

The class speaks SGLang's ``AdaptiveSpecPolicy`` protocol (``candidate_steps``, ``set_cuda_graph_bs``,
``get_steps_for_batch``, ``on_verify_complete``, ``cuda_graph_bs_for_step``) so SGLang's own
``AdaptiveController`` swaps the runtime states, and reads SGLang's ``--speculative-adaptive-config``
JSON (per-batch-size ``candidate_steps``); it has no SGLang import and runs on plain numbers.
"""

from __future__ import annotations

import bisect
import json
import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
LEVEL_ALPHA = 0.3  # weight of one of the choice's cycles in the host speed: about the last 3
NEAR_LOSS = 0.10  # a candidate this much slower than the choice, or more, is probed at the base rate


@dataclass(frozen=True)
class ControllerConfig:
    """keep: retention of a depth's acceptance counts per request drafted to that depth (0.98: about
    the last 50). cost_alpha: weight of a new cycle time in its step count's relative cost (once a
    few are in). prior_accept, prior_weight: the prior depth-1 acceptance and its weight in
    pseudo-requests. warmup_cycles: timed cycles of each candidate before the bucket chooses by
    cost. probe_every: cycles between two probes of other step counts, at the most (0: never; each
    other candidate is probed once in ``probe_every`` x their number, down to an eighth of that for
    a near-tie; probes are at least ``probe_every / 16`` cycles apart). margin: a new
    choice must beat the current one by this fraction (no flapping between near-equal choices).
    outlier: cap of one cycle time, in multiples of its expected time. cold_plain: 0-step cycles skip
    the draft's catch-up pass, and prefills into a bucket settled on 0 steps skip the target's top-K_pre
    and the draft's prefill pass (module docstring). scout_every: with cold_plain, one such prefill in
    this many still runs warm (1: all run warm). scout_near: with cold_plain, every such prefill runs
    warm while the bucket's best drafting candidate is expected at least (1 - scout_near) times as fast
    as plain decoding (0: only the scouts), since a warm prefill costs about 2 % of a 128-token
    answer here, about what being wrong about such a near-tie costs."""

    keep: float = 0.98
    cost_alpha: float = 0.2
    prior_accept: float = 0.5
    prior_weight: float = 2.0
    warmup_cycles: int = 2
    probe_every: int = 64
    margin: float = 0.02
    outlier: float = 1.5
    cold_plain: bool = True
    scout_every: int = 4
    scout_near: float = 0.03

    def __post_init__(self) -> None:
        if not isinstance(self.cold_plain, bool):
            raise ValueError(f"controller cold_plain must be true or false, got {self.cold_plain!r}")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"controller keep must lie in (0, 1], got {self.keep}")
        if not 0.0 < self.cost_alpha <= 1.0:
            raise ValueError(f"controller cost_alpha must lie in (0, 1], got {self.cost_alpha}")
        if not 0.0 <= self.prior_accept <= 1.0 or self.prior_weight <= 0:
            raise ValueError("controller prior_accept must lie in [0, 1] and prior_weight be > 0")
        if self.warmup_cycles < 1 or self.margin < 0 or self.probe_every < 0:
            raise ValueError("controller warmup_cycles must be >= 1, margin and probe_every >= 0")
        if not isinstance(self.scout_every, int) or self.scout_every < 1:
            raise ValueError(f"controller scout_every must be an integer >= 1, got {self.scout_every!r}")
        if (isinstance(self.scout_near, bool) or not isinstance(self.scout_near, (int, float))
                or not 0.0 <= self.scout_near < 1.0):
            raise ValueError(f"controller scout_near must lie in [0, 1), got {self.scout_near!r}")
        if not self.outlier > 1.0:
            raise ValueError(f"controller outlier must be > 1, got {self.outlier}")


def read_adaptive_config(path: str | Path | None, max_steps: int) -> tuple[dict[int, list[int]],
                                                                           ControllerConfig]:
    """(batch-size bucket -> candidate step counts, controller settings) from SGLang's adaptive config
    JSON, read once. Integer-string keys hold ``{"candidate_steps": [...]}`` (their other keys are
    SGLang's accept-length rule's and are not used here); top-level keys named as
    ``ControllerConfig``'s fields (``probe_every``, ``keep``, ...) tune the controller, SGLang's own
    top-level keys (``ema_alpha``, ...) are skipped. Without a file: 0..max_steps for every bucket of
    ``DEFAULT_BUCKETS`` and the default settings. ValueError naming the file and key for anything
    else, or for a candidate above ``max_steps`` (the chain the server was sized for,
    ``--speculative-num-steps``)."""
    if path is None:
        return {bs: list(range(max_steps + 1)) for bs in DEFAULT_BUCKETS}, ControllerConfig()
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"adaptive config {path}: cannot read it as JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"adaptive config {path}: expected an object keyed by batch size")
    out: dict[int, list[int]] = {}
    for key, entry in raw.items():
        if not str(key).isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if (not isinstance(steps, list) or not steps
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)):
            raise ValueError(f"adaptive config {path}: batch size {key}: candidate_steps must be a "
                             f"non-empty list of non-negative integers, got {steps!r}")
        if max(steps) > max_steps:
            raise ValueError(f"adaptive config {path}: batch size {key}: candidate step {max(steps)} "
                             f"exceeds --speculative-num-steps {max_steps}, the longest chain the "
                             "server is sized for")
        out[int(key)] = sorted(set(steps))
    if not out:
        raise ValueError(f'adaptive config {path}: no batch-size key such as "1": '
                         '{"candidate_steps": [0, 1, 2, 3]}')
    names = set(ControllerConfig.__dataclass_fields__)
    try:
        config = ControllerConfig(**{k: v for k, v in raw.items() if k in names})
    except (TypeError, ValueError) as e:
        raise ValueError(f"adaptive config {path}: {e}") from None
    return out, config


def ema(old: float | None, new: float, alpha: float) -> float:
    """Exponential moving average of a measured time; the first measurement is taken as is."""
    return new if old is None else (1 - alpha) * old + alpha * new


def expected_tokens(accept: list[float], k: int) -> float:
    """E(k): tokens a cycle with k draft steps emits, given per-depth conditional acceptance
    ``accept[d - 1]`` = a_d."""
    total, p = 1.0, 1.0
    for d in range(k):
        p *= accept[d]
        total += p
    return total


@dataclass
class Bucket:
    """What one batch-size bucket has learned. hits/tries[d - 1]: decayed counts at depth d.
    rel_cost[k]: log of a k-step cycle's seconds less ``level``, the log host speed the choice's
    cycles follow (None: not timed yet); timed[k]: cycles timed;
    draft_s / verify_s[k]: the draft and verify parts of it, for reports; ran[k]: cycles run.
    choice: the step count chosen by cost; current: the one running (the choice, or a probe)."""

    candidates: list[int]
    depth: int
    hits: list[float] = field(default_factory=list)
    tries: list[float] = field(default_factory=list)
    rel_cost: dict[int, float | None] = field(default_factory=dict)
    level: float | None = None
    timed: dict[int, int] = field(default_factory=dict)
    compared: dict[int, int] = field(default_factory=dict)  # k -> cycles priced against the choice's
    draft_s: dict[int, float] = field(default_factory=dict)
    verify_s: dict[int, float] = field(default_factory=dict)
    ran: dict[int, int] = field(default_factory=dict)
    current: int = 0
    choice: int = 0
    pending: int | None = None  # a drafting choice deferred by one catch-up cycle
    settled_prefills: int = 0  # prefills since the bucket settled on plain decoding
    since_probe: int = 0
    probes: int = 0
    clock: int = 0  # priced cycles so far
    last_timed: dict[int, int] = field(default_factory=dict)  # k -> clock at its last timed cycle

    def __post_init__(self) -> None:
        self.hits = [0.0] * self.depth
        self.tries = [0.0] * self.depth
        self.rel_cost = {k: None for k in self.candidates}
        self.timed = dict.fromkeys(self.candidates, 0)
        self.compared = dict.fromkeys(self.candidates, 0)
        self.ran = dict.fromkeys(self.candidates, 0)

    def cycle_s(self, k: int) -> float | None:
        """Seconds of a k-step cycle at the host's current speed (None: not timed yet)."""
        rel = self.rel_cost[k]
        return None if rel is None or self.level is None else math.exp(self.level + rel)

    @property
    def cycles(self) -> int:
        """Cycles priced so far (each step count's first timed cycle is not)."""
        return sum(max(n - 1, 0) for n in self.timed.values())


class StepController:
    """Per-bucket choice of draft steps (the module docstring has the model).

    The worker calls ``launched(batch_size, k)`` after each decode cycle it ran and ``record(kind,
    batch_size, k, seconds)`` as cycle ("cycle", "draft", "verify") times become known; SGLang's
    ``AdaptiveController`` calls ``get_steps_for_batch`` before each cycle and ``on_verify_complete``
    with each cycle's accepted draft counts, in launch order.
    """

    def __init__(self, candidates: dict[int, list[int]], initial_steps: int,
                 config: ControllerConfig | None = None):
        if not candidates:
            raise ValueError("StepController needs at least one batch-size bucket")
        self.config = config or ControllerConfig()
        self._bs = sorted(candidates)
        depth = max(max(c) for c in candidates.values())
        self.buckets = {bs: Bucket(list(c), max(depth, 1)) for bs, c in candidates.items()}
        for b in self.buckets.values():
            b.current = initial_steps if initial_steps in b.candidates else b.candidates[-1]
        self._cuda_graph_bs: list[int] | None = None
        # (bucket, k, per request: counted?), oldest first
        self._launched: deque[tuple[int, int, list[bool] | None]] = deque(maxlen=8)
        self.decide_s = 0.0  # wall time spent choosing, for the "under 1% of a step" check
        self.decisions = 0
        self.draft_behind = False  # the last decode cycle skipped the draft's catch-up pass
        self._catch_up = False  # the cycle under way is the catch-up cycle before a drafting one
        self.caught_up = False  # the last decode cycle was a catch-up cycle (its time is not priced)
        self.skipped = 0  # catch-up passes skipped, for reports
        self.catch_ups = 0  # catch-up cycles inserted before a drafting cycle
        self.cold_prefills = 0  # prefills that skipped the drafting-only work

    # -- SGLang's AdaptiveSpecPolicy ---------------------------------------------------------

    @property
    def candidate_steps(self) -> list[int]:
        return sorted({k for b in self.buckets.values() for k in b.candidates})

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        """The captured batch sizes whose bucket may run ``step`` (None: no CUDA graphs)."""
        if self._cuda_graph_bs is None:
            return None
        return [bs for bs in self._cuda_graph_bs if step in self.buckets[self.bucket_of(bs)].candidates]

    def get_steps_for_batch(self, batch_size: int) -> int:
        t = time.perf_counter()
        b = self.buckets[self.route(batch_size)]
        if b.pending is not None and not self.draft_behind:
            k, b.pending = b.pending, None
        else:
            k = self.choose(b)
        self._catch_up = k > 0 and self.draft_behind
        if self._catch_up:  # the draft missed its last pass: one plain cycle with it first
            b.pending, k = k, 0
            self.catch_ups += 1
        b.current = k
        self.decide_s += time.perf_counter() - t
        self.decisions += 1
        return k

    def skip_catch_up(self, k: int, must_run: bool = False) -> bool:
        """Called once per decode cycle, at its draft-extend, with the cycle's step count: True when
        the cycle skips the pass (a 0-step cycle with ``cold_plain``, unless it is the catch-up cycle
        before a drafting one, or the worker ``must_run`` it: it keeps the skipped positions' inputs
        for a few cycles only). A pass that runs leaves the draft up to date."""
        skip = k == 0 and self.config.cold_plain and not self._catch_up and not must_run
        self.caught_up = k == 0 and self._catch_up
        self._catch_up = False
        self.draft_behind = skip
        self.skipped += skip
        return skip

    def cold_prefill(self, batch_size: int) -> bool:
        """Called before each prefill with the number of requests that decode once its requests join:
        True when the prefill skips the target's top-K_pre and the draft's prefill pass, because that
        bucket has timed every candidate and chose 0 steps (with ``cold_plain``), except one prefill
        in ``scout_every`` and any while drafting is a near-tie (``scout_near``). The draft is then
        behind, so a cycle with the catch-up pass runs before any cycle drafts."""
        b = self.buckets[self.route(batch_size)]
        need = self.config.warmup_cycles + 1
        settled = (self.config.cold_plain and b.choice == 0 and b.pending is None
                   and all(b.timed[k] >= need for k in b.candidates))
        b.settled_prefills = b.settled_prefills + 1 if settled else 0
        cold = (settled and b.settled_prefills % self.config.scout_every != 0
                and not self.drafting_near(b, self.config.scout_near))
        if cold:
            self.draft_behind = True
            self.cold_prefills += 1
        return cold

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> None:
        """Count per-depth acceptance of the oldest launched cycle; never asks for a switch itself
        (``get_steps_for_batch`` decides before each cycle)."""
        if not self._launched or not num_correct_drafts_per_req:
            return None
        bs, k, counted = self._launched.popleft()
        if k == 0 or max(num_correct_drafts_per_req) > k:  # nothing drafted, or not that cycle's
            return None
        b, keep = self.buckets[bs], self.config.keep
        for i, n in enumerate(num_correct_drafts_per_req):
            if counted is not None and i < len(counted) and not counted[i]:
                continue  # a request whose prompt the draft never saw (a cold prefill)
            for d in range(min(n + 1, k)):  # depths 1..n accepted, n+1 rejected
                b.tries[d] = b.tries[d] * keep + 1.0
                b.hits[d] = b.hits[d] * keep + (d < n)
        return None

    # -- the worker's reports ---------------------------------------------------------------

    def launched(self, batch_size: int, k: int, counted: list[bool] | None = None) -> None:
        """A decode cycle of ``batch_size`` requests ran with ``k`` steps; its verify result follows.
        counted: per request of the batch, in order, whether its acceptance counts (False: its prefill
        ran cold); None: all count."""
        bs = self.route(batch_size)
        self._launched.append((bs, k, counted))
        ran = self.buckets[bs].ran
        if k in ran:
            ran[k] += 1

    def record(self, kind: str, batch_size: int, k: int, seconds: float) -> None:
        """A measured time: kind "cycle" (start of one decode cycle to the start of the next),
        "draft" or "verify"."""
        b = self.buckets[self.route(batch_size)]
        if k not in b.rel_cost:
            return
        a = self.config.cost_alpha
        if kind == "cycle":
            b.timed[k] += 1
            if b.timed[k] == 1:  # a step count's first cycle pays one-off work: not priced
                return
            b.clock += 1
            x, rel = math.log(seconds), b.rel_cost[k]
            if rel is None:  # first priced cycle: against the host speed the cycles before it set
                if b.level is None:
                    b.level = 0.0
                b.rel_cost[k] = x - b.level
            else:
                x = min(x, b.level + rel + math.log(self.config.outlier))
                if k == b.choice:  # the choice's cycles follow the host's speed
                    b.level = ema(b.level, x - rel, LEVEL_ALPHA)
                else:  # another step count's cycle: its cost relative to the choice's, timed now
                    b.compared[k] += 1  # a mean of the first few, then a forgetting average
                    b.rel_cost[k] = ema(rel, x - b.level, max(a, 1 / (b.compared[k] + 1)))
            b.last_timed[k] = b.clock
        elif kind in ("draft", "verify") and b.timed[k]:  # not the first cycle's (see above)
            part = b.draft_s if kind == "draft" else b.verify_s
            part[k] = ema(part.get(k), seconds, a)

    # -- the model ---------------------------------------------------------------------------

    def route(self, batch_size: int) -> int:
        """The bucket of a batch: padded to the CUDA-graph batch size it replays at, then the largest
        bucket not above it (SGLang's adaptive routing)."""
        if self._cuda_graph_bs is not None:
            i = bisect.bisect_left(self._cuda_graph_bs, batch_size)
            if i < len(self._cuda_graph_bs):
                batch_size = self._cuda_graph_bs[i]
        return self.bucket_of(batch_size)

    def bucket_of(self, batch_size: int) -> int:
        return self._bs[max(0, bisect.bisect_right(self._bs, batch_size) - 1)]

    def acceptance(self, b: Bucket) -> list[float]:
        """a_d for d = 1..depth: decayed counts plus the prior (an unseen depth takes the rate of the
        depth above)."""
        w, prior, out = self.config.prior_weight, self.config.prior_accept, []
        for h, t in zip(b.hits, b.tries, strict=True):
            rate = (h + w * prior) / (t + w)
            out.append(rate)
            prior = rate
        return out

    def rates(self, b: Bucket) -> dict[int, float | None]:
        """Expected tokens per second of each candidate (None: not timed yet)."""
        acc = self.acceptance(b)
        return {k: (None if c is None else expected_tokens(acc, k) / c)
                for k, c in ((k, b.cycle_s(k)) for k in b.candidates)}

    def choose(self, b: Bucket) -> int:
        """The step count the bucket runs next: an under-timed candidate while warming up (the
        current one first); else the fastest by E(k)/C(k), unless the last choice is within
        ``margin`` of it; or a probe of the other candidate most overdue (``overdue``), the nearest to
        the choice among equals."""
        need = self.config.warmup_cycles + 1  # + the unpriced first cycle
        if b.timed.get(b.current, 0) < need:
            b.choice = b.current
            return b.current
        for k in b.candidates:
            if b.timed[k] < need:
                b.choice = k
                return k
        r = self.rates(b)
        best = max(b.candidates, key=lambda k: r[k])
        last = r.get(b.choice)
        if last is None or r[best] > last * (1 + self.config.margin):
            b.choice = best
        others = [k for k in b.candidates if k != b.choice]
        b.since_probe += 1
        every = self.config.probe_every
        if every and others and b.since_probe >= max(1, every // 16):
            due = {k: self.overdue(b, r, k, every * len(others)) for k in others}
            k = max(others, key=lambda k: (due[k], -abs(k - b.choice), k))
            if due[k] >= 1.0:
                b.since_probe = 0
                b.probes += 1
                return k
        return b.choice

    def drafting_near(self, b: Bucket, within: float) -> bool:
        """Whether a drafting candidate of ``b`` is expected at least (1 - within) times as fast as
        plain decoding (False while either is untimed)."""
        r = self.rates(b)
        drafting = [v for k, v in r.items() if k > 0 and v is not None]
        return r.get(0) is not None and bool(drafting) and max(drafting) >= (1 - within) * r[0]

    def overdue(self, b: Bucket, rates: dict[int, float | None], k: int, period: int) -> float:
        """Priced cycles since candidate k was last timed, in units of its probe period: ``period``
        for a candidate ``NEAR_LOSS`` or more slower than the choice, down to period / 8 for one
        as fast (probing a near-tie costs little and settles a choice the noise may have got wrong)."""
        loss = max(0.0, 1.0 - rates[k] / rates[b.choice])
        scaled = period * min(1.0, max(1 / 8, loss / NEAR_LOSS))
        return (b.clock - b.last_timed.get(k, 0)) / scaled

    def report(self) -> dict:
        """Per bucket: acceptance per depth, E(k), cycle/draft/verify ms, tokens per second, current
        choice; plus the controller's own mean decision time. JSON-ready."""
        out: dict = {"decide_us": 1e6 * self.decide_s / max(self.decisions, 1), "buckets": {},
                     "skipped_catch_up": self.skipped, "catch_up_cycles": self.catch_ups,
                     "cold_prefills": self.cold_prefills}
        for bs, b in self.buckets.items():
            if not b.cycles:
                continue
            acc, r = self.acceptance(b), self.rates(b)
            out["buckets"][str(bs)] = {
                "choice": b.choice, "cycles": b.cycles, "ran": dict(b.ran),
                "accept_per_depth": [round(a, 3) for a in acc],
                "expected_tokens": {k: round(expected_tokens(acc, k), 3) for k in b.candidates},
                "cycle_ms": {k: None if b.cycle_s(k) is None else round(1e3 * b.cycle_s(k), 3)
                             for k in b.candidates},
                "draft_ms": {k: round(1e3 * s, 3) for k, s in sorted(b.draft_s.items())},
                "verify_ms": {k: round(1e3 * s, 3) for k, s in sorted(b.verify_s.items())},
                "tok_per_s": {k: None if v is None else round(v, 2) for k, v in r.items()},
            }
        return out


def steps_mix(report: dict) -> str:
    """The share of decode cycles run at each step count over all buckets of a ``report()``, e.g.
    "k=0 12%, k=1 88%" (what a benchmark table shows as the controller's configuration)."""
    ran: dict[int, int] = {}
    for b in report.get("buckets", {}).values():
        for k, n in b.get("ran", {}).items():
            ran[int(k)] = ran.get(int(k), 0) + int(n)
    total = sum(ran.values())
    if not total:
        return "no decode cycles"
    return ", ".join(f"k={k} {100 * n / total:.0f}%" for k, n in sorted(ran.items()) if n)
