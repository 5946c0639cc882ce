"""detgrid.bench: the benchmark harness and the workloads it shares with the GPU check.

- workloads: the cases and benchmark workloads of detgrid's backward (seeded
  inputs at any scale), how each variant is run, compared and timed;
- stock_limits: where stock PyTorch's CPU backward cannot serve as a
  reference (and so is neither compared with nor timed);
- matrix: `detgrid bench`, the benchmark matrix of shared BENCHMARKS.md,
  timed, with its JSON, Markdown table and plot.

It uses the runtime package (detgrid.ops, detgrid.switch) and nothing of
detgrid.kit; nothing here is imported by `import detgrid`. This file
imports nothing, so that the GPU check's script mode can load workloads
without the extension.
"""
