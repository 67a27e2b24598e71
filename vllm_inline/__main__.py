"""``python -m vllm_inline demo|chat [--model M]`` and ``check --model M``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
