"""Schedules: from fused groups in loop-nest form to kernel-IR functions, per target."""
