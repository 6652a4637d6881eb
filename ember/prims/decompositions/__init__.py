"""The decomposition table, one module per family.  Importing this package fills
`ember.prims.registry.DECOMPOSITIONS` and derives the in-place spellings."""
from ember.prims.decompositions import (  # noqa: F401
    activations,
    attention,
    creation,
    elementwise,
    indexing,
    linalg,
    losses,
    norms,
    pooling,
    random,
    reductions,
    views,
)
from ember.prims.registry import derive_inplace_variants

derive_inplace_variants()
