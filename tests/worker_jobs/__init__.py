"""Background jobs against the real demo server over HTTP: launch, answer delivery, cancel delivery, sweeps.

The jobs run directly (their async functions, on a loop of their own as in the worker) or in a
procrastinate worker run in-process until the queue is empty. A recording proxy in front of the demo
server counts what really went over the wire; `/demo/stats` counts deliveries and cancels per task.
"""
