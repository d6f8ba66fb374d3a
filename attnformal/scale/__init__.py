"""Scaling evidence: sweep one parameter, fit exponents, and explain them with the schedule.

``python -m attnformal.scale --impl torch-tiled --vs sdpa --mask dense causal window:256``

* :mod:`~attnformal.scale.work` -- predicted work of a problem, counted from the spec's mask
  and the tiles the schedule visits (no separate scaling formula).
* :mod:`~attnformal.scale.fit` -- log-log exponent with its uncertainty, the range where it
  holds, and refusal when the points cannot support one.
* :mod:`~attnformal.scale.measure` -- synchronised timing and isolated peak memory on CPU,
  CUDA and Ascend NPU.
* :mod:`~attnformal.scale.backends` -- which SDPA backend or device kernel actually ran.
* :mod:`~attnformal.scale.problem`, :mod:`~attnformal.scale.sweep` -- sweep points, and
  running implementations on them interleaved.
* :mod:`~attnformal.scale.analysis`, :mod:`~attnformal.scale.report`,
  :mod:`~attnformal.scale.plot` -- verdicts, table / JSON / CSV, PNG.
"""
