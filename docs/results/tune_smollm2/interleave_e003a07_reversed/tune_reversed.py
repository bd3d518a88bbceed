"""One-off: ``nanospec.bench.tune`` with its servers started in reverse order (NANOSPEC's controller
first, AR last), to see whether the server started last on a nearly full 24 GiB host runs slow whatever
its method. Takes tune's arguments:

    .venv/bin/python docs/results/tune_smollm2/interleave_e003a07_reversed/tune_reversed.py \
        --target smollm2-135m --draft nanospec/drafts/smollm2-135m \
        --questions ../shared/data/mt_bench/question.jsonl --per-category 1 --max-turns 1 \
        --max-new-tokens 128 --configs 1/1/2,2/1/3,3/1/4 --no-fixed-nanospec --interleave --out runs/rev
"""
import sys

from nanospec.bench import tune

_methods = tune.methods
tune.methods = lambda *a, **k: list(reversed(_methods(*a, **k)))
sys.exit(tune.main())
