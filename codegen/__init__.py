"""kspec: declare JAX Pallas kernels in YAML, generate, check, verify, bench and tune them.

The package is a straight pipeline, one module per stage:

    loader -> schema -> model -> checks (+ rules) -> render -> writer
    generated module -> verify / bench / tune

`pipeline` wires the stages for the CLI; nothing imports jax until verify/bench/tune.
"""

