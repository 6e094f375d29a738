"""XLA:CPU's fusion, worked around in the Transformer block's backward pass on JAX (`TransformerBlock` calls
these): a gradient materialised once between blocks, and activations recomputed where `jax.checkpoint` saves
nothing on the CPU."""

import keras

from keras_vit.runtime import per_platform


def cotangent_barrier(x):
    """Identity; on JAX on the CPU, the gradient flowing back through it is materialised once.

    XLA:CPU fuses the elementwise part of the backward pass (residual adds, LayerNorm gradients)
    across blocks into every consumer that needs the residual gradient transposed for a weight
    gradient, so each such consumer recomputes the chain back to the last block: the backward pass
    of ViT-S/16 spent half its time there. A conditional is a fusion boundary XLA keeps (an
    optimization barrier is expanded away on CPU before fusion), so the gradient goes through one
    whose predicate is always true, yet not foldable at compile time. Not on GPU/TPU, where XLA
    fuses well and a conditional would cost a host round trip: the choice is made for the platform
    the step is lowered for (`runtime.per_platform`), so a step traced on a CPU host and lowered
    for a TPU or GPU holds no conditional.
    """
    return _jax_cotangent_barrier()(x) if keras.backend.backend() == "jax" else x


_JAX_BARRIER = []


def _jax_cotangent_barrier():
    if not _JAX_BARRIER:
        import jax

        @jax.custom_vjp
        def barrier(x):
            return x

        def fwd(x):
            return x, None

        def bwd(_, g):
            return (per_platform(g, cpu=materialised, default=lambda t: t),)

        barrier.defvjp(fwd, bwd)
        _JAX_BARRIER.append(barrier)
    return _JAX_BARRIER[0]


def materialised(x, after=None):
    """`x` through a conditional XLA keeps as a fusion boundary (JAX), its predicate computed from
    `after` (default `x`), so it runs once `after` is there: the branches must differ, or XLA folds
    it away; the second never runs."""
    import jax

    return jax.lax.cond(_always_true(x if after is None else after), lambda t: t, lambda t: -t, x)


def _always_true(x):
    """A true scalar XLA cannot fold at compile time (a function of `x`'s first entry, NaN or not)."""
    import jax.numpy as jnp

    first = x.reshape(-1)[0]
    return jnp.isnan(first) | ~jnp.isnan(first)


def jax_cpu_remat(fn, variables, x, keep=()):
    """`fn(x, keep)` with its activations recomputed in the backward pass, for JAX on the CPU.

    `jax.checkpoint` (what `keras.remat` is on JAX) saves nothing there: XLA:CPU expands the
    optimization barriers that keep the recomputation apart before common-subexpression
    elimination, which then merges the recomputation back into the forward pass. Here the forward
    keeps only the input, the dropout and drop-path masks `keep` and the weights (`variables`'
    current values, passed explicitly so their gradients flow), and the backward recomputes from the
    input passed through a conditional, a value XLA cannot identify with the forward's, so nothing
    merges.
    `fn` closes over no traced value: the backward is traced later, where none would be in scope
    (inside `per_platform`'s conditional, JAX fails to lower one).
    """
    import jax

    def pure(x, values, keep):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return fn(x, keep)

    @jax.custom_vjp
    def run(x, values, keep):
        return pure(x, values, keep)

    def fwd(x, values, keep):
        return pure(x, values, keep), (x, values, keep)

    def bwd(saved, g):
        x, values, keep = saved
        return jax.vjp(pure, materialised(x, after=g), values, keep)[1](g)

    run.defvjp(fwd, bwd)
    return run(x, [v.value for v in variables], keep)
