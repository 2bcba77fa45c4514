"""Flax MNIST's task: a small CNN's jitted training steps on random images, and tensorflow_datasets imports."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import tensorflow_datasets  # noqa: F401


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(features=8, kernel_size=(3, 3))(x))
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2)).reshape((x.shape[0], -1))
        return nn.Dense(features=10)(x)


images, labels = jnp.ones((4, 28, 28, 1)), jnp.arange(4)
params = CNN().init(jax.random.PRNGKey(0), images)["params"]
tx = optax.sgd(0.1)
state = tx.init(params)


@jax.jit
def step(params, state):
    def loss(p):
        logits = CNN().apply({"params": p}, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    value, grads = jax.value_and_grad(loss)(params)
    updates, state = tx.update(grads, state)
    return optax.apply_updates(params, updates), state, value


for _ in range(3):
    params, state, value = step(params, state)
print("flax: 3 jitted steps, loss", float(value))
