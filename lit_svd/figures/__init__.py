"""Figures as pure functions of result objects: ``lit_svd.figures.<method>.figures(result)`` returns
``{name: matplotlib Figure}`` (the run's PNG names). Each such function is registered for its result type with
``lit_svd.results.base.draws``, so that ``result.figures`` finds it without the results layer importing this one;
importing this package registers them all (one per type of ``lit_svd.results.TYPES``: a test checks it).
Nothing here runs a model or writes a file (``lit_svd.output.save_figure`` writes them)."""

from lit_svd.figures import (  # noqa: F401  (imported to register their figures functions)
    circuits,
    directions,
    edge_circuits,
    faithfulness,
    masks,
    mounts,
    sad,
    tasks,
    toy,
    training,
)
