"""`accelerate launch train/eagle3.py ...` and `python train/eagle3.py ...`: the trainer is
`nanospec.train` (`python -m nanospec.train` is the same entry point); see docs/training.md."""

from nanospec.train.eagle3 import main

if __name__ == "__main__":
    main()
