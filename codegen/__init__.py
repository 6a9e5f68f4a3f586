"""kspec's toolchain, laid out as its pipeline; dependencies point one way, down this list
(tests/test_layout.py holds them to it):

    diagnostics/  located diagnostics: codes, formatting, did-you-mean
    spec/         YAML text -> model: loader (positions), schema, expressions, model (frozen
                  dataclasses), dtypes, the sharding and vjp sections, tuning tables
    backends/     the backend table, hardware rules and device peaks
    checks/       semantic checks over the model: names, structure, the names code reads,
                  per-case instances (bounds, coverage), mesh kernels, sharding, vjp
    emit/         model -> generated files (render, templates/; each file's context from a module
                  of its own: signature, kernel with blocks and mesh, package, vjp, sharded)
                  and the writer (atomic, drift)
    project.py    the project (configuration, folders), compiling a spec, planning its package
    run/          what runs in worker processes: the task protocol, the pool, the worker, inputs,
                  comparison, timing, bench and grad runners, the TPU schedule simulator
    verify/ bench/ tune/
                  the commands' planning and reports

cli.py (kspec.cli) only parses arguments and prints. Nothing imports jax outside run/.
"""
