"""Distributed plumbing: the device mesh, the logical-axis rules table, sharding helpers.

A leaf package: it imports nothing from model, data or train.
"""
