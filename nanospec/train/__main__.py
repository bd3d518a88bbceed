"""`python -m nanospec.train ...`: train an EAGLE-3 draft (nanospec/train/eagle3.py; docs/training.md)."""

from nanospec.train.eagle3 import main

main()
