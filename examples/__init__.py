"""Example implementations to point the tools at, installed with the package (``attnformal.examples.NAME:FUNC``)."""
