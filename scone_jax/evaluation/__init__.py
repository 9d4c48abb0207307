"""Evaluating a finished or running run from its directory: above train and serve, which it both
uses."""
