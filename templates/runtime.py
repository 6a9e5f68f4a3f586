"""What every generated kernel package shares: tuned-config lookup and backend dispatch.

`kspec generate` writes this module beside the packages; each package's `_tuning.py` and
`_dispatch.py` hold its own tables and rules and call these functions. It imports only jax
and the standard library, jax only where a function needs it: kspec itself imports this file
for `bucket` and `dtype_label_of`, so that the tuning tables it writes and the packages that
read them key configs by one definition.

Tuned configs. `kspec tune` records the fastest params per (device kind, backend, input
dtypes, bucket, untuned params), the bucket being each dim rounded up to a power of two. A
call takes the entry of its own bucket; when there is none, the nearest tuned bucket of the
same device kind, backend, dtypes and untuned params, by the distance

    sum over the dims d = 1, 2, ... of d * |log2(tuned bucket dim) - log2(call bucket dim)|

(ties go to the larger bucket, then the first in dim order), and only an entry whose params
satisfy the spec's constraints and the backend's own (its constraints, and the shared memory it
declares it needs within the GPU's limit) at the call's own dims and dtypes. Dims further right weigh more: in the
row-major layouts kernels read, the minor dims decide what one program holds (a row's width,
a tile's columns), the major ones mostly how many programs there are. Without one, the spec's defaults
apply (which may be expressions over the dims).

Dispatch. backend="auto" tries the platform's backends in the spec's order and takes the
first whose rules hold for the call's dims and params (power-of-two blocks and the declared
shared memory on Triton, TMA boxes and shared memory on Mosaic GPU, (8, 128) tiles on TPU, the spec's constraints), then
the reference. Each backend passed over is reported once per reason with a
KernelFallbackWarning.
"""

import math
import warnings


class KernelFallbackWarning(UserWarning):
    """backend="auto" passed over a backend that cannot run a call, naming why."""


class UnsupportedCallError(ValueError):
    """The call breaks the kernel's constraints, or the backend asked for cannot run it."""


def bucket(dims):
    """Each dim rounded up to a power of two."""
    return tuple(1 << max(int(d) - 1, 0).bit_length() for d in dims)


def dtype_label(inputs):
    """The inputs' dtypes, each named once in order: "float32" or "bfloat16,float32"."""
    return dtype_label_of(str(x.dtype) for x in inputs if x is not None)  # None: an absent optional input


def dtype_label_of(names):
    """dtype_label from the dtypes' names."""
    return ",".join(dict.fromkeys(names))


def distance(a, b):
    """How far apart two buckets are: the |log2| ratios of their dims, the d-th weighted by d."""
    return sum(d * abs(math.log2(x) - math.log2(y)) for d, (x, y) in enumerate(zip(a, b), 1))


def nearest(table, device_kind, backend, dtype, untuned, call_bucket):
    """The tuned configs of the call's kind (device kind, backend, dtypes, untuned params),
    nearest bucket first."""
    near = [
        (bucket_, params)
        for (kind, b, d, bucket_, fixed), params in table.items()
        if kind == device_kind and b == backend and d == dtype and fixed == untuned
    ]
    near.sort(key=lambda e: (distance(e[0], call_bucket), -sum(e[0]), e[0]))
    return near


def resolve(table, defaults, satisfies, backend, inputs, dims, given, untuned):
    """A call's params: those `given` (not None), else the tuned config of the call's bucket
    or of the nearest tuned bucket that satisfies the constraints, else `defaults`.
    `satisfies(*dims, params)`: the spec's constraints; `untuned`: the call's other params."""
    import jax

    params = dict(defaults)
    found = nearest(table, jax.devices()[0].device_kind, backend, dtype_label(inputs),
                    tuple(sorted(untuned.items())), bucket(dims))
    for _, tuned in found:
        if satisfies(*dims, dict(params, **untuned, **tuned)):
            params.update(tuned)
            break
    params.update({k: v for k, v in given.items() if v is not None})
    return params


def cdiv(a, b):
    return -(-a // b)


def is_pow2(n):
    return n >= 1 and n & (n - 1) == 0


# Shared memory one block may use (the opt-in maximum, bytes) by CUDA compute capability; a GPU not
# listed here, or no GPU (a CPU lowering for CUDA), is taken for Hopper's.
SHARED_MEMORY_PER_BLOCK = {"7.0": 96 << 10, "7.5": 64 << 10, "8.0": 163 << 10, "8.6": 99 << 10, "8.7": 163 << 10,
                           "8.9": 99 << 10, "9.0": 227 << 10, "10.0": 227 << 10, "12.0": 99 << 10}


def shared_memory_limit():
    """Bytes of shared memory one block may use on the default device's GPU."""
    import jax

    capability = str(getattr(jax.devices()[0], "compute_capability", "9.0"))
    return SHARED_MEMORY_PER_BLOCK.get(capability, SHARED_MEMORY_PER_BLOCK["9.0"])


def tpu_packing(dtype):
    """Elements of `dtype` per 32-bit word as Mosaic TPU stores them (bool as int32; 0 for
    64-bit types)."""
    import jax

    dtype = jax.numpy.dtype(dtype)
    bits = 32 if dtype == bool else 4 if dtype.name in ("int4", "uint4") else 8 * dtype.itemsize
    return 32 // bits


def cast_outputs(out, dtype, which):
    """The reference's result with the outputs marked in `which` (one flag per returned output)
    cast to `dtype`, the call's out_dtype; unchanged when dtype is None."""
    if dtype is None:
        return out
    if not isinstance(out, (tuple, list)):
        return out.astype(dtype) if which[0] else out
    return type(out)(o.astype(dtype) if w else o for o, w in zip(out, which))


def shown(names, values):
    """"M=1000, N=768": the dims of a call, for messages."""
    return ", ".join(f"{n}={v}" for n, v in zip(names, values))


_warned = set()


def warn_once(message):
    """A KernelFallbackWarning, once per distinct message in this process."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, KernelFallbackWarning, stacklevel=4)


def choose(kernel, backend, platform, auto, platforms, why_not, slower=None):
    """The backend a call runs on, or None for the reference.

    `backend`: "auto" or a declared name; `auto`: the platform's backends in order of
    preference; `why_not(name)`: why that backend cannot run this call (None: it can);
    `slower(name)`: with "auto", why the reference is preferred to it (None: it is not)."""
    if backend != "auto":
        if backend not in platforms:
            raise ValueError(f"{kernel}: unknown backend {backend!r}; declared: {', '.join(platforms)}")
        if platform not in platforms[backend]:
            can = ", ".join(b for b in platforms if platform in platforms[b]) or "none"
            raise ValueError(
                f"{kernel}: backend {backend!r} cannot run on platform {platform!r}; backends that can: {can}"
            )
        reason = why_not(backend)
        if reason is not None:
            raise UnsupportedCallError(f"{kernel}: backend {backend!r} cannot run this call: {reason}")
        return backend
    order = auto.get(platform, ())
    if not order:
        raise ValueError(f"{kernel}: no backend for platform {platform!r}; declared: {', '.join(platforms)}")
    for i, name in enumerate(order):
        reason = why_not(name)
        if reason is None and slower is not None:
            preferred = slower(name)
            if preferred is not None:
                warn_once(f"{kernel}: calling the reference instead of backend {name!r}: {preferred}")
                return None
        if reason is None:
            return name
        instead = order[i + 1] if i + 1 < len(order) else "the reference"
        warn_once(f"{kernel}: backend {name!r} cannot run this call ({reason}); trying {instead}")
    return None


class Unwritten:
    """The ref of a residual output that a call did not ask for (residuals=False): the output is
    left out of the pallas_call, and the body's stores to this stand-in are dropped."""

    def __init__(self, kernel, name, dtype, shape):
        import jax.numpy as jnp

        self.kernel, self.name, self.dtype, self.shape = kernel, name, jnp.dtype(dtype), tuple(shape)

    @property
    def ndim(self):
        return len(self.shape)

    def __setitem__(self, index, value):
        pass

    def __getitem__(self, index):
        raise TypeError(f"{self.kernel}: the body reads {self.name}, a residual output, written only with residuals=True")


def written(items, residuals, omitted):
    """`items`, one per kernel output, without the residual outputs' (at `omitted`) unless residuals=True."""
    return list(items) if residuals else [x for n, x in enumerate(items) if n not in omitted]


def inserted(items, placed):
    """`items` with each (position, value) of `placed` put back at its position, in ascending order
    of position: the refs of residual outputs left out of a call (their Unwritten), or None for
    each such output among the call's results."""
    items = list(items)
    for position, value in placed:
        items.insert(position, value)
    return items
