"""EAGLE-3 draft training for NanoSpec: full-vocabulary heads SGLang loads as is (see docs/training.md)."""
