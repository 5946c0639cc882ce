#!/usr/bin/env bash
# The tests whose subject is the compiled extension, run with a given build of
# it: its operators, checks and messages (aten's own checks, per release), the
# switch's registrations, the build record's guard, torch.compile reaching the
# override, agreement with this release's stock kernels, the golden bits of the
# kernels' host builds as compiled there. Left out are the kit's tooling tests (patch,
# report, GPU-check harness, repro scripts, bench, CLI, README, CI scripts,
# in-tree compile, SASS audit, the upstream stack's cut and level diffs,
# patches, bodies and per-level host builds): plain Python over files and
# trees whose results do not depend on the torch the extension was built
# against, run once already by README's test command; rerunning them cost
# much of a build check. A new test file is included unless listed here.
#   bash .ci/extension_tests.sh PYTHON   from the root of a tree with tests/,
#                                        PYTHON importing the build to test
set -euo pipefail
python=${1:?usage: extension_tests.sh PYTHON}
kit_tests=(test_patch.py test_report.py test_gpucheck.py test_repro.py test_bench.py
           test_cli.py test_readme.py test_ci_scripts.py test_ci_run.py test_intree_compile.py
           test_sass_audit.py test_build.py test_stock_limits.py test_stack_patches.py
           test_textdiff.py)
"$python" -m pytest tests -q -p no:cacheprovider "${kit_tests[@]/#/--ignore=tests/}"
