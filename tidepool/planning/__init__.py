"""Offline tools: measure a model per batch size (profiler, needs torch) and turn a saved profile and
budgets into a config.pbtxt (profile, planner: numpy and protobuf only)."""
