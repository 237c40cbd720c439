"""Everything that runs where requests come from: Triton clients, sweeps, reports."""
