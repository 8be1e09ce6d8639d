"""autoremat with Flax, Equinox and Optax (``pip install "autoremat[integrations]"``).

Each submodule imports its framework; import the one you use:

| framework | use |
|---|---|
| Flax NNX | :mod:`autoremat.integrations.flax_nnx`: ``optimize(loss_fn, budget)`` for ``loss_fn(model, *batch)``, used under ``nnx.grad``; ``plan``/``apply`` to read a plan first |
| Equinox | :mod:`autoremat.integrations.equinox`: the same for ``eqx.Module`` models, used under ``eqx.filter_value_and_grad`` |
| Optax | :mod:`autoremat.integrations.optax`: ``TrainStep(loss_fn, optimizer, budget)``, whose plan leaves room for the optimizer state |
| Flax Linen | nothing to add: ``model.apply`` is a pure function, so plan the loss built on it |

Flax Linen, with layers under ``nn.scan`` (one remat region per iteration; an
``nn.remat`` in the model is replaced by the plan) and batch statistics as an output::

    def loss_fn(params, batch_stats, x, y):
        out, updates = model.apply({"params": params, "batch_stats": batch_stats}, x,
                                   mutable=["batch_stats"])
        return jnp.mean((out - y) ** 2), updates

    fast_loss = autoremat.optimize(loss_fn, budget="2GiB")
    (loss, updates), grads = jax.value_and_grad(fast_loss, has_aux=True)(
        params, batch_stats, x, y)

For the model-object frameworks the plan is made for the pure function
``loss(static, arrays, *batch)`` (:mod:`autoremat.integrations._functional`): the plan's
report, saved policy file and memory plot describe that function.
"""  # noqa: E501 (the table's rows cannot wrap in Markdown)
