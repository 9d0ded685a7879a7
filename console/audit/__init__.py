"""The audit log (issue 30): who did what to which object of a team, append-only."""
