"""Per-launcher argv and environment for gang members: pure functions, no imports of ours."""
