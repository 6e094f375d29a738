"""The random initial values of the layers' weights, left out where a checkpoint writes every weight next.

A model built to be loaded (`keras_vit.variants.VisionTransformer` with `weights`, `keras_vit.convert.build_from`)
is built inside `overwritten()`: every weight the layers ask `initial` for starts at zeros instead of a random
draw that the checkpoint replaces (a load writes all of `keras_vit.weights.official_variables` or refuses). The
draws were most of a build's time on JAX, where each initializer compiles at each new shape. Only initializers
a layer sets inside its `build` go through `initial`: one in a layer's config (a `Dense` of the functional
model) would be saved as zeros.
"""

import contextlib
import contextvars

_OVERWRITTEN = contextvars.ContextVar("keras_vit_overwritten", default=False)


@contextlib.contextmanager
def overwritten():
    """Builds inside start every weight that `initial` is asked about at zeros: for a model whose every weight
    a checkpoint writes right after."""
    token = _OVERWRITTEN.set(True)
    try:
        yield
    finally:
        _OVERWRITTEN.reset(token)


def initial(initializer):
    """`initializer` (a name or a `keras.initializers` object), or "zeros" inside `overwritten()`."""
    return "zeros" if _OVERWRITTEN.get() else initializer
