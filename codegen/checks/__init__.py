"""Stage 4: semantic checks over the model (`semantic.check`), with the per-case instances, the mesh kernels, `sharding:` and `vjp:`."""
