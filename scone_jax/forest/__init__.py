"""The prefix forest of a batch's f-grams and its static block layout: SCONE's central data
structure, numpy only (built on the host, read by the f-gram model on the device)."""
