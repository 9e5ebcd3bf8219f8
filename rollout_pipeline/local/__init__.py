"""Local mode: the whole pipeline on one machine (moto server, local consumers, agent and model processes)."""
