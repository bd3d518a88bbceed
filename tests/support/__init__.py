"""Shared helpers for NanoSpec's tests: tiny local models and a real SGLang server fixture helper.

See ``tests/support/tiny_models.py`` and ``tests/support/sglang_server.py`` for the API.
"""
