"""Run the fuzzer as `python -m minicomp.fuzz`."""

from minicomp.fuzz.cli import main

# A guard, not style: the worker processes are spawned and import the main module again.
if __name__ == "__main__":
    raise SystemExit(main())
