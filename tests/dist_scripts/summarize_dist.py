"""``profcallbacks summarize DIR`` as one rank of a torchrun job (each rank takes its share)."""

import sys

from profcallbacks.cli import main

if __name__ == "__main__":
    sys.exit(main(["summarize", *sys.argv[1:]]))
