"""Shared helpers for NanoSpec's tests: tiny local models and a real SGLang server fixture helper.

The fixtures an installed NanoSpec needs too live in ``nanospec/testing.py``; ``tests/support/tiny_models.py``
re-exports them with what only tests need, ``tests/support/sglang_server.py`` re-exports the launcher.
"""
