"""Who may start a session, and when: the account's schedule, shares, call budgets, admission (docs/lifecycle.md,
"Limits")."""
