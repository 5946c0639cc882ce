# Owner(s): ["module: nn"]
"""How detgrid installs: which CUDA compiler and architectures a build uses
(detgrid.kit.toolchain, shared by setup.py and `detgrid build --dry-run`), the
loud failure when torch has CUDA and no compiler fits, the torch-version
guard (detgrid.buildinfo), the verbs that need the kit's source tree, and
the CLI's --version and --help. No GPU and no CUDA build needed: the
toolchain is probed through fakes; .ci/install_check.sh does the real
pip-only build, the wheel and its install."""

import argparse
import contextlib
import io
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace
from unittest import mock

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid import buildinfo
from detgrid.kit import build, cli, parsing, sourcetree, toolchain

KIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_toolkit(root, major="13", cudart="libcudart.so.13"):
    """A folder shaped like a CUDA toolkit: bin/nvcc and lib/<cudart>."""
    for sub in ("bin", "lib"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    nvcc = os.path.join(root, "bin", "nvcc")
    with open(nvcc, "w") as f:
        f.write(f"#!/bin/sh\necho 'Cuda compilation tools, release {major}.0, V{major}.0.88'\n")
    os.chmod(nvcc, 0o755)
    open(os.path.join(root, "lib", cudart), "w").close()
    return root


def fake_torch(version, cuda, archs=("sm_80", "sm_90"), gpus=()):
    """A torch with CUDA release `cuda` built for `archs`, and GPUs of the
    capabilities `gpus` ((9, 0) for an H200) visible."""
    return SimpleNamespace(
        __version__=version, version=SimpleNamespace(cuda=cuda), _C=None,
        cuda=SimpleNamespace(get_arch_list=lambda: list(archs),
                             is_available=lambda: bool(gpus),
                             device_count=lambda: len(gpus),
                             get_device_capability=lambda index: gpus[index]))


def find(torch_cuda="13.0", env=None, nvcc_on_path=None, pip_homes=(), system_home="/nonexistent",
         version="13.0"):
    return toolchain.find_toolkit(
        torch_cuda, env=env or {}, which=lambda name: nvcc_on_path,
        pip_homes=list(pip_homes), system_home=system_home,
        version_of=lambda nvcc: version, home_of=lambda nvcc: os.path.dirname(
            os.path.dirname(nvcc)))


class TestToolkitDiscovery(TestCase):
    def test_cuda_home_comes_first(self):
        kit = find(env={"CUDA_HOME": "/opt/cuda"}, nvcc_on_path="/usr/bin/nvcc",
                   pip_homes=["/site/nvidia/cu13"])
        self.assertEqual((kit.home, kit.source), ("/opt/cuda", "CUDA_HOME"))
        self.assertEqual(find(env={"CUDA_PATH": "/opt/c"}).home, "/opt/c")

    def test_nvcc_on_path_comes_before_the_pip_toolkit(self):
        kit = find(nvcc_on_path="/usr/local/cuda-13.0/bin/nvcc", pip_homes=["/site/nvidia/cu13"])
        self.assertEqual((kit.home, kit.source), ("/usr/local/cuda-13.0", "PATH"))

    def test_pip_toolkit_comes_before_the_usual_system_folder(self):
        with tempfile.TemporaryDirectory() as system:
            kit = find(pip_homes=["/site/nvidia/cu13"], system_home=system)
            self.assertEqual((kit.home, kit.source), ("/site/nvidia/cu13", "pip"))
            self.assertEqual(find(system_home=system).source, system)

    def test_nothing_found_is_none(self):
        self.assertIsNone(find())

    def test_pip_toolkit_is_the_nvidia_folder_of_torchs_cuda_major_with_nvcc(self):
        with tempfile.TemporaryDirectory() as root:
            fake_toolkit(os.path.join(root, "cu13"))
            os.makedirs(os.path.join(root, "cu12", "include"))  # no nvcc: not a toolkit
            self.assertEqual(toolchain.pip_toolkit_homes("13", [root]),
                             [os.path.join(root, "cu13")])
            self.assertEqual(toolchain.pip_toolkit_homes("12", [root]), [])

    def test_a_wrapper_nvcc_on_path_is_resolved_to_its_toolkit(self):
        # /usr/local/bin/nvcc exec-ing the toolkit's: the folder above the
        # wrapper (/usr/local) is not the toolkit; nvcc -dryrun says which is.
        dryrun = SimpleNamespace(stdout="", stderr="#$ _HERE_=/usr/local/cuda-13.0/bin\n#$ TOP=x\n")
        home = toolchain.nvcc_home("/usr/local/bin/nvcc", run=lambda *a, **k: dryrun)
        self.assertEqual(home, "/usr/local/cuda-13.0")

    def test_nvcc_version_is_read_from_its_banner(self):
        with tempfile.TemporaryDirectory() as root:
            kit = fake_toolkit(root, major="12")
            self.assertEqual(toolchain.nvcc_version(os.path.join(kit, "bin", "nvcc")), "12.0")
        self.assertIsNone(toolchain.nvcc_version("/nonexistent/nvcc"))


class TestLoudFailure(TestCase):
    def test_no_compiler_names_the_pip_command_and_the_opt_out(self):
        message = toolchain.unusable(None, "2.14.1+cu130", "13.0")
        self.assertIn("torch 2.14.1+cu130 has CUDA 13.0, but no CUDA compiler was found", message)
        self.assertIn('pip install "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-crt==13.0.*" '
                      '"nvidia-nvvm==13.0.*" "nvidia-cuda-cccl==13.0.*" '
                      '"nvidia-cuda-runtime==13.0.*"', message)
        self.assertIn("CUDA_HOME", message)
        self.assertIn("DETGRID_CPU_ONLY=1", message)
        self.assertNotIn("\n", message)

    def test_cuda_12_torch_is_not_sent_to_pip_for_a_compiler(self):
        message = toolchain.unusable(None, "2.6.0+cu124", "12.4")
        self.assertNotIn("pip install", message)
        self.assertIn("no compiler driver", message)

    def test_a_compiler_of_another_major_is_refused(self):
        kit = toolchain.Toolkit(KIT, "CUDA_HOME", "12.4")
        with mock.patch("os.path.isfile", return_value=True):
            message = toolchain.unusable(kit, "2.14.1+cu130", "13.0")
        self.assertIn("is CUDA 12", message)
        self.assertIn("would not load", message)

    def test_cuda_home_without_nvcc_is_refused(self):
        with tempfile.TemporaryDirectory() as root:
            message = toolchain.unusable(toolchain.Toolkit(root, "CUDA_HOME"), "2.14.1", "13.0")
        self.assertIn("bin/nvcc does not exist (CUDA_HOME)", message)

    def test_a_matching_compiler_is_usable(self):
        with tempfile.TemporaryDirectory() as root:
            fake_toolkit(root)
            self.assertIsNone(toolchain.unusable(toolchain.Toolkit(root, "pip", "13.0"),
                                                 "2.14.1+cu130", "13.0"))

    def test_a_cuda_torch_without_a_compiler_raises_and_a_cpu_torch_builds_host_only(self):
        cuda_torch = fake_torch("2.14.1+cu130", "13.0")
        with self.assertRaisesRegex(toolchain.Unusable, "no CUDA compiler was found"):
            toolchain.cuda_plan(cuda_torch, {}, find=lambda cuda: None)
        plan = toolchain.cuda_plan(fake_torch("2.13.0+cpu", None), {}, find=lambda cuda: None)
        self.assertEqual(plan.describe(), "host builds only (torch 2.13.0+cpu has no CUDA)")

    def test_detgrid_cpu_only_is_the_explicit_opt_out(self):
        plan = toolchain.cuda_plan(fake_torch("2.14.1+cu130", "13.0"), {"DETGRID_CPU_ONLY": "1"},
                                   find=lambda cuda: None)
        self.assertEqual(plan.describe(), "host builds only (DETGRID_CPU_ONLY=1)")

    def test_setup_py_fails_the_install_with_the_reason(self):
        # The real setup.py: on this CPU torch the CUDA decision is skipped,
        # so stand in a CUDA torch whose toolkit (CUDA_HOME) has no nvcc.
        with tempfile.TemporaryDirectory() as fake:
            with open(os.path.join(fake, "sitecustomize.py"), "w") as f:
                f.write("import torch\ntorch.version.cuda = '13.0'\n")
            env = dict(os.environ, PYTHONPATH=fake, CUDA_HOME=os.path.join(fake, "no-toolkit"))
            env.pop("DETGRID_CPU_ONLY", None)
            proc = subprocess.run([sys.executable, "setup.py", "--name"], cwd=KIT, env=env,
                                  capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]
        self.assertTrue(
            last.startswith(f"detgrid: torch {torch.__version__} has CUDA 13.0, but "), last)
        self.assertIn("bin/nvcc does not exist (CUDA_HOME)", last)
        self.assertIn("DETGRID_CPU_ONLY=1", last)


class TestArchitectures(TestCase):
    TORCH_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]

    def test_default_is_what_torch_was_built_for_with_ptx_for_the_newest(self):
        archs, origin = toolchain.arch_list({}, self.TORCH_ARCHS, "13.0")
        self.assertEqual(archs, "7.5;8.0;8.6;9.0;10.0;12.0+PTX")
        self.assertIn("torch was built for", origin)

    def test_torch_cuda_arch_list_overrides(self):
        self.assertEqual(toolchain.arch_list({"TORCH_CUDA_ARCH_LIST": "9.0"}, self.TORCH_ARCHS,
                                             "13.0"), ("9.0", "TORCH_CUDA_ARCH_LIST"))
        self.assertEqual(toolchain.arch_list({"TORCH_CUDA_ARCH_LIST": "8.6"}, self.TORCH_ARCHS,
                                             "13.0", ["9.0"]), ("8.6", "TORCH_CUDA_ARCH_LIST"))

    def test_visible_gpus_are_built_for_with_ptx_for_the_newest(self):
        archs, origin = toolchain.arch_list({}, self.TORCH_ARCHS, "13.0", ["9.0"])
        self.assertEqual(archs, "9.0+PTX")
        self.assertIn("the GPUs visible here (9.0)", origin)
        self.assertEqual(toolchain.arch_list({}, self.TORCH_ARCHS, "13.0",
                                             ["9.0", "8.0", "9.0"])[0], "8.0;9.0+PTX")

    def test_a_gpu_newer_than_torch_gets_torchs_newest_architecture(self):
        self.assertEqual(toolchain.arch_list({}, ["sm_80", "sm_90"], "12.4", ["12.0"])[0],
                         "9.0+PTX")

    def test_the_plan_asks_torch_for_the_visible_gpus(self):
        kit = toolchain.Toolkit("/site/nvidia/cu13", "pip", "13.0")
        with mock.patch.object(toolchain, "unusable", return_value=None):
            one_h200 = toolchain.cuda_plan(
                fake_torch("2.14.1+cu130", "13.0", self.TORCH_ARCHS, gpus=[(9, 0)]), {},
                find=lambda cuda: kit)
            login_node = toolchain.cuda_plan(
                fake_torch("2.14.1+cu130", "13.0", self.TORCH_ARCHS), {}, find=lambda cuda: kit)
        self.assertEqual(one_h200.archs, "9.0+PTX")
        self.assertEqual(login_node.archs, "7.5;8.0;8.6;9.0;10.0;12.0+PTX")
        self.assertIn("no GPU visible here", login_node.describe())

    def test_a_torch_that_reports_no_architectures_gets_the_documented_default(self):
        self.assertEqual(toolchain.arch_list({}, [], "13.0")[0], toolchain.DEFAULT_ARCHS["13"])
        self.assertEqual(toolchain.arch_list({}, ["compute_90"], "12.4")[0],
                         toolchain.DEFAULT_ARCHS["12"])

    def test_arch_names_convert_to_torch_cuda_arch_list_spelling(self):
        self.assertEqual([toolchain.arch_of(a) for a in ("sm_90", "sm_90a", "sm_100a", "sm_120",
                                                         "compute_90")],
                         ["9.0", "9.0a", "10.0a", "12.0", None])

    def test_torchs_list_is_read_without_a_gpu(self):
        cuda = SimpleNamespace(get_arch_list=lambda: [])
        flags = SimpleNamespace(_cuda_getArchFlags=lambda: "sm_80 sm_90")
        fake = SimpleNamespace(cuda=cuda, _C=flags)
        self.assertEqual(toolchain.torch_arch_list(fake), ["sm_80", "sm_90"])
        self.assertEqual(toolchain.torch_arch_list(torch), torch.cuda.get_arch_list())


class TestCudartLink(TestCase):
    def test_pip_runtime_gets_an_unversioned_libcudart_to_link_against(self):
        with tempfile.TemporaryDirectory() as root:
            kit = fake_toolkit(os.path.join(root, "cu13"))
            scratch = os.path.join(root, "link")
            self.assertEqual(toolchain.link_dir_for_cudart(kit, scratch), scratch)
            self.assertEqual(os.readlink(os.path.join(scratch, "libcudart.so")),
                             os.path.join(kit, "lib", "libcudart.so.13"))
            # a second build replaces the link
            self.assertEqual(toolchain.link_dir_for_cudart(kit, scratch), scratch)

    def test_a_system_toolkit_links_as_it_is(self):
        with tempfile.TemporaryDirectory() as root:
            kit = fake_toolkit(root, cudart="libcudart.so")
            self.assertIsNone(toolchain.link_dir_for_cudart(kit, os.path.join(root, "link")))


class TestVersionGuard(TestCase):
    def test_matching_torch_loads(self):
        self.assertIsNone(buildinfo.mismatch("2.14.1+cu130", "13.0", "2.14.1+cu130", "13.0"))

    def test_other_torch_is_refused_in_one_line_naming_both_and_the_fix(self):
        message = buildinfo.mismatch("2.13.0+cpu", None, "2.14.1+cu130", "13.0")
        self.assertEqual(message.count("\n"), 0)
        self.assertTrue(message.startswith(
            "detgrid was built for torch 2.13.0+cpu (CPU only) but torch 2.14.1+cu130 "
            "(CUDA 13.0) is running: "), message)
        self.assertIn("--no-build-isolation", message)
        self.assertIn("torch==2.13.0+cpu", message)

    def test_same_release_with_another_cuda_is_refused(self):
        self.assertIsNotNone(buildinfo.mismatch("2.14.1", "13.0", "2.14.1", "12.8"))

    def test_check_raises_import_error_under_a_mismatched_fake_torch(self):
        fake = SimpleNamespace(__version__="9.9.9+fake", version=SimpleNamespace(cuda=None))
        record = SimpleNamespace(TORCH_VERSION=torch.__version__, TORCH_CUDA=torch.version.cuda)
        with mock.patch.object(buildinfo, "recorded", return_value=record):
            with self.assertRaisesRegex(ImportError, r"^detgrid was built for torch "
                                        + torch.__version__.replace("+", r"\+")
                                        + r" .* but torch 9\.9\.9\+fake \(CPU only\) is running"):
                buildinfo.check(fake)
            buildinfo.check(torch)  # the running torch: loads

    def test_an_unrecorded_tree_is_not_guarded(self):
        with mock.patch.object(buildinfo, "recorded", return_value=None):
            buildinfo.check(SimpleNamespace(__version__="0", version=SimpleNamespace(cuda=None)))
            self.assertIn("not recorded", buildinfo.summary())

    def test_this_build_recorded_the_running_torch(self):
        info = buildinfo.recorded()
        if info is None:
            self.skipTest("detgrid here was not built by setup.py")
        self.assertEqual((info.TORCH_VERSION, info.TORCH_CUDA),
                         (torch.__version__, torch.version.cuda))


class TestSourceTree(TestCase):
    def test_the_kit_checkout_has_what_every_verb_needs(self):
        for verb in sourcetree.NEEDS:
            self.assertIsNone(sourcetree.needs_source_tree(verb, KIT), verb)

    def test_an_installed_copy_says_so_in_one_line(self):
        with tempfile.TemporaryDirectory() as site:
            message = sourcetree.needs_source_tree("report", site)
        self.assertEqual(message.count("\n"), 0)
        self.assertIn("needs the kit's source tree (repro, patches)", message)
        self.assertIn("run `detgrid report` from a clone", message)

    def test_report_from_an_installed_copy_fails_in_one_line_and_writes_nothing(self):
        with tempfile.TemporaryDirectory() as site:
            err = io.StringIO()
            with mock.patch.object(sourcetree, "KIT_ROOT", site), \
                    mock.patch("detgrid.kit.report.write", side_effect=AssertionError("wrote")), \
                    contextlib.redirect_stderr(err):
                rc = cli.main(["report"])
            self.assertEqual(os.listdir(site), [])
        self.assertEqual(rc, 2)
        self.assertEqual(err.getvalue().count("\n"), 1, err.getvalue())
        self.assertTrue(err.getvalue().startswith("detgrid report: needs the kit's source tree"))

    def test_build_extension_from_an_installed_copy_fails_in_one_line(self):
        with tempfile.TemporaryDirectory() as site:
            with self.assertRaisesRegex(build.BuildError, "needs the kit's source tree"):
                build.plan_build(mode="extension", kit_root=site, jobs=1,
                                 describe_cuda=lambda arch, origin: [])


class TestDryRunTellsTheTruth(TestCase):
    PIP_KIT = toolchain.Toolkit("/site/nvidia/cu13", "pip", "13.0")

    @contextlib.contextmanager
    def machine(self, env=None, toolkit=PIP_KIT, gpus=()):
        """A CUDA 13.0 torch built for 8.0 and 9.0, `toolkit` found, GPUs of
        the architectures `gpus` visible, and `env` the only build variables."""
        with mock.patch.object(torch.version, "cuda", "13.0"), \
                mock.patch.object(toolchain, "visible_gpu_archs", return_value=list(gpus)), \
                mock.patch.object(toolchain, "find_toolkit", return_value=toolkit), \
                mock.patch.object(toolchain, "unusable",
                                  wraps=lambda kit, *a: None if kit else "no compiler"), \
                mock.patch.object(toolchain, "torch_arch_list", return_value=["sm_80", "sm_90"]), \
                mock.patch.dict(os.environ, env or {}):
            for name in ("TORCH_CUDA_ARCH_LIST", "DETGRID_CPU_ONLY"):
                if name not in (env or {}):
                    os.environ.pop(name, None)
            yield

    def notes(self, arch=None, origin="", env=None, toolkit=PIP_KIT, gpus=()):
        with self.machine(env, toolkit, gpus):
            return build.extension_cuda_notes(arch, origin)

    def test_extension_dry_run_names_the_compiler_and_architectures(self):
        self.assertEqual(self.notes(), [
            "CUDA kernels with /site/nvidia/cu13/bin/nvcc (CUDA 13.0; found via pip) for "
            "8.0;9.0+PTX (the architectures torch was built for, PTX for the newest: no GPU "
            "visible here and TORCH_CUDA_ARCH_LIST unset)"])
        self.assertIn("for 9.0 (--cuda-arch)", self.notes("9.0", "--cuda-arch")[0])
        self.assertIn("for 8.6 (TORCH_CUDA_ARCH_LIST)",
                      self.notes(env={"TORCH_CUDA_ARCH_LIST": "8.6"})[0])

    def test_extension_dry_run_with_one_h200_builds_for_it_alone(self):
        self.assertEqual(self.notes(gpus=["9.0"]), [
            "CUDA kernels with /site/nvidia/cu13/bin/nvcc (CUDA 13.0; found via pip) for "
            "9.0+PTX (the GPUs visible here (9.0), PTX for the newest; TORCH_CUDA_ARCH_LIST "
            "unset)"])
        self.assertIn("for 8.6 (TORCH_CUDA_ARCH_LIST)",
                      self.notes(env={"TORCH_CUDA_ARCH_LIST": "8.6"}, gpus=["9.0"])[0])

    def test_extension_dry_run_prints_the_plan_of_the_visible_gpus(self):
        out = io.StringIO()
        with self.machine(gpus=["9.0"]), contextlib.redirect_stdout(out):
            self.assertEqual(cli.main(["build", "--mode", "extension", "--dry-run"]), 0)
        self.assertIn("# note: CUDA kernels with /site/nvidia/cu13/bin/nvcc", out.getvalue())
        self.assertIn("for 9.0+PTX (the GPUs visible here (9.0)", out.getvalue())
        self.assertNotIn("TORCH_CUDA_ARCH_LIST=", out.getvalue())  # setup.py decides

    def test_extension_dry_run_warns_of_a_build_that_will_fail(self):
        self.assertEqual(self.notes(toolkit=None), ["this build will fail: no compiler"])

    def test_extension_dry_run_honours_the_opt_out(self):
        self.assertEqual(self.notes(env={"DETGRID_CPU_ONLY": "1"}),
                         ["host builds only (DETGRID_CPU_ONLY=1)"])


class TestCommandLine(TestCase):
    def test_version_names_the_package_and_its_build(self):
        proc = subprocess.run([sys.executable, "-m", "detgrid", "--version"],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(proc.stdout.startswith("detgrid 0.1.0: "), proc.stdout)
        self.assertEqual(proc.stdout.count("\n"), 1)

    def test_help_shows_defaults(self):
        parser = cli.build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        verify_help = sub.choices["verify"].format_help()
        self.assertIn("(default: 10)", verify_help)
        self.assertIn("(default: auto)", verify_help)
        self.assertIn("(default: full)", sub.choices["build"].format_help())
        # an option without a default shows none, rather than "(default: None)"
        self.assertNotIn("(default: None)", sub.choices["bench"].format_help())
        for name, verb in sub.choices.items():
            self.assertIsInstance(verb.formatter_class(name), parsing.HelpFormatter, name)


class TestPackaging(TestCase):
    def test_setup_declares_what_the_package_imports(self):
        with open(os.path.join(KIT, "setup.py")) as f:
            source = f.read()
        self.assertIn('"numpy"', source)
        self.assertIn('f"torch=={public}"', source)


if __name__ == "__main__":
    run_tests()
