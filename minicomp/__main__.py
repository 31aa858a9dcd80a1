"""Run the `minicomp` command as `python -m minicomp`."""

from minicomp.cli import main

raise SystemExit(main())
