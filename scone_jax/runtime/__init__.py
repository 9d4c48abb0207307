"""The multi-process runtime: joining a job, the peer watchdog, barriers.

A leaf package: it imports nothing from model, data or train.
"""
