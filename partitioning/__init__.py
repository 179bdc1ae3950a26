"""Plans (TP / PP / EP / DP), per-socket programs, memory footprints, plan search."""
