"""A differential fuzzer: random PyTorch programs compiled by minicomp and compared with eager.

The layers, in processing order: `program` (a program as data, printed as Python source),
`ops` (the table of op applications the generator draws from), `generate` (a random valid
program from a seed), `check` (one program run eagerly and compiled, compared), `worker`
(runs in a child process, so a crash is a finding and not the end), `shrink` (a failing
program cut down to a minimal one), `regression` (a minimal program saved as a pytest file),
`session` (the time-bounded loop) and `cli` (`python -m minicomp.fuzz`). See docs/fuzz.md.
"""
