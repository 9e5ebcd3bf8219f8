"""Global limits shared by every caller in every process, by what each keeps:

- `pacing`: paced ACR call budgets (`Pacer`, GCRA over `LIMIT/PACE#...`) and the `LimitedRuntime` that takes them;
- `slots`: which session-slot counter a dispatch takes its slot on (`SlotShards`);
- `admission`: which waiting rollouts go first (`SlotGate`, `AdmissionBoard`, `SessionRoom`).
"""
