"""One GRPO round, stage by stage, as every node runs it (daemon and simulation alike):

    generate -> publish -> receive -> admit -> draw -> defend -> score -> advantages -> update

:mod:`generate`, :mod:`receive`, :mod:`admit`, :mod:`draw`, :mod:`defend`, :mod:`score`, :mod:`advantages` and
:mod:`update` are the stages; :mod:`node` holds a node's parts and calls them in order; :mod:`run` runs one
round over a transport; :mod:`outcome` holds the typed records a round produces and :mod:`observer` the one
interface that consumes them; :mod:`build` assembles a node from a run configuration.
"""
