"""Helpers of the benchmark suite, not measurements: the models it runs (`shapes`), the timing and
ceilings (`measure`), the shared setup of a run (`setup`), named spans of a gate (`spans`), the
RESULTS tables (`report_md`) and `nojit` (a script runner without ModelOpt's CUDA-kernel JIT build)."""
