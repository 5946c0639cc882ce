"""detgrid.kit: the tooling around the runtime package, for the upstream change.

The `detgrid` command line (cli) and what its verbs run: `verify` (verify,
with the same-bits rule of bitwise), `patch` (patch, patch_apply; the
upstream v2.6.0 tree of upstream_tree), `report` (report), `build` (build,
toolchain, which setup.py also loads by path, and sourcetree), and the
checks CI and the GPU check run as modules: intree_compile, sass_audit,
gpucheck and gpucheck_report.

Nothing here is imported by `import detgrid`, and this file imports
nothing: setup.py, `python3 tools/detgrid/kit/gpucheck.py` and the tests
load single modules of the kit without the extension.
"""
