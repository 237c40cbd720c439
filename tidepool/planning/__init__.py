"""Offline tools: measure a model per batch size (profiler, needs torch) and turn a saved profile and
budgets into a config.pbtxt (profile, plan, choose, candidates, config_writer: numpy and protobuf
only); verify candidates on a real server, and re-plan from a live one."""
