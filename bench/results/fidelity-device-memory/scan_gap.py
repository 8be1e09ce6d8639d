import jax, jax.numpy as jnp, sys
from autoremat import _measure
B,S,D,V,L = 8,1024,768,int(sys.argv[1]),int(sys.argv[2])
scan = sys.argv[3] == "scan"
def layer(h, w):
    return jnp.tanh(h @ w) + h
def loss(p, x):
    h = p["emb"][x]
    if scan:
        h, _ = jax.lax.scan(lambda h, w: (layer(h, w), None), h, p["w"])
    else:
        for i in range(L): h = layer(h, p["w"][i])
    logits = h @ p["head"]
    return -jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[..., 0])
bf = jnp.bfloat16
p = {"emb": jax.ShapeDtypeStruct((V, D), bf), "w": jax.ShapeDtypeStruct((L, D, D), bf), "head": jax.ShapeDtypeStruct((D, V), bf)}
x = jax.ShapeDtypeStruct((B, S), jnp.int32)
m = _measure.measure_step(loss, p, x, target="tpu-v5e")
M=2**20
print(sys.argv[1:], "device", m.peak_bytes/M, "cpeak", m.compiler_peak_bytes/M, "temp", m.temp_bytes/M, "args", m.argument_bytes/M, "logits", B*S*V*2/M)
