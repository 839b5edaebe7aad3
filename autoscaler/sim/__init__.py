"""The simulator: the production control loop against a simulated cluster on a virtual clock.

- ``traces``: the demand (CSV ``t_s,model,rps``) and seeded generators;
- ``queueing``: the validated fluid M/M/1 latency model of one replica;
- ``cluster``: ``SimCluster``, the Inventory + Actuator + MetricsSource the loop talks to;
- ``run``: ``simulate(...)`` -- one policy over one trace, scored;
- ``report``: tables, JSON and the PNG; ``scenarios``: synthetic fleets for benchmarks.

Policies live in ``autoscaler/policy`` (``decide`` + planner for migscale,
``baselines`` for the others); nothing here decides anything.
"""
