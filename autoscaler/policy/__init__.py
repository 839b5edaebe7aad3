"""The pure policy core (zero I/O): demand, HPA math and behaviors, planner, plan diff.

Everything here is a function of values: ``decide(observation, state, config,
now_s) -> (plan, state)``. Adapters in ``observe/`` and ``act/`` feed it and
carry out what it returns; the simulator runs the very same functions.
"""
