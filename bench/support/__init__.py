"""Set-up shared by the benchmark scripts (not a benchmark itself: ``make bench`` runs bench/*.py)."""
