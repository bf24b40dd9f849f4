"""tent-bench: the benchmarks and test beds of TENT and refhub, kept out of the core wheels.

``tent bench`` (:mod:`tent_bench.cli`) and ``refhub bench`` (:mod:`tent_bench.refhub.cli`) join
their command lines through entry points; :mod:`tent_bench.testbed` builds real multi-rail
networks between Linux network namespaces.
"""

__version__ = "0.1.0"
