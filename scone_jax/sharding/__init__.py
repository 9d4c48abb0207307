"""The device mesh, the logical-axis rules table, and the shardings of params, batches and forest
buffers.

A leaf package: it imports nothing from model, data or train.
"""
