"""The model suite under every backend: what `minicomp bench` runs, as a script.

    python benchmarks/models.py --models gpt2,bert-base --dtypes float16 --batch 1,16

takes the same arguments as `minicomp bench` (see docs/bench.md).
"""

import sys

from minicomp.bench.runner import main

if __name__ == "__main__":
    sys.exit(main())
