"""The compiler command lines a torch release's cpp_extension.py would give
setup.py's extension, computed without that torch installed (for
.ci/old_torch_compile.sh).

Only the release's torch/utils/cpp_extension.py and headers are at hand (the
wheel's torch/include and that one file), so the module cannot be imported:
it imports the rest of torch at its top. Instead its own flag-building code
is taken out of its source with `ast` and run here, unchanged:

  COMMON_NVCC_FLAGS                        (module constant)
  include_paths(device_type)               (module function)
  _get_cuda_arch_flags(cflags)             (module function; TORCH_CUDA_ARCH_LIST set)
  BuildExtension.build_extensions's nested
    append_std17_if_no_std_present(cflags) (its default -std, and that it adds
                                            none when the flags hold one)
    unix_cuda_flags(cflags)                (what it puts around the nvcc flags)

The glue between them is replayed as those releases write it, and the parts
of it this replay assumes are checked in the source, so that a release that
changed them fails here instead of being replayed wrongly:

  - build_extensions appends each constant `self._add_compile_flag(extension,
    '-D...')` flag and -DTORCH_EXTENSION_NAME=<last part of the name> to every
    list of extra_compile_args (cxx and nvcc), in source order, after
    setup.py's own flags; flags whose value comes from the torch binary
    (torch._C: 2.6's -D_GLIBCXX_USE_CXX11_ABI and -DPYBIND11_* ABI keys) are
    left out and named on stderr: they select std::string's layout and name
    pybind11's ABI, neither of which decides whether a unit compiles; flags
    under an `if` (py_limited_api, ROCm) do not apply to this build.
  - unix_wrap_ninja_compile (the default, ninja path) calls
    append_std17_if_no_std_present(post_cflags) on the cxx flags, then
    unix_cuda_flags(cuda_post_cflags) and append_std17_if_no_std_present(
    cuda_post_cflags) on the nvcc flags;
  - its ninja rules run `$cxx -MMD -MF $out.d $cflags -c $in -o $out
    $post_cflags` and `$nvcc ... $cuda_cflags -c $in -o $out $cuda_post_cflags`,
    where cflags is the interpreter's own compiler flags (sysconfig CFLAGS and
    CCSHARED) followed by the preprocessor options (-D macros, then -I for
    the extension's include_dirs, then Python's include folder), and
    cuda_cflags the preprocessor options alone.

setup.py's flags are read from its source too (CXX_FLAGS and NVCC_FLAGS,
literal lists), with the late CUDA library include folders added as its
extension() adds them (-idirafter for g++, -Xcompiler=-idirafter for nvcc).

Usage:
  python3 old_torch_flags.py --torch-root DIR --setup setup.py --root REPO
      --cuda-home DIR [--late-include DIR]... --out DIR
writes DIR/cpu.args (a .cpp of the host-only build), DIR/cuda.args (a .cpp of
the CUDA build) and DIR/nvcc.args (the CUDA unit): the arguments of one
compile, NUL-separated, without the compiler, with the token @SOURCE@ where
the source file goes.
"""

import argparse
import ast
import collections
import os
import re
import sys
import sysconfig

EXTENSION_NAME = "detgrid._C"
ARCH_LIST = "9.0"
HOST_RULE = "$cflags -c $in -o $out $post_cflags"
CUDA_RULE = "$cuda_cflags -c $in -o $out $cuda_post_cflags"


class Unsupported(Exception):
    pass


def literal_list(tree, name, where):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise Unsupported(f"{where} has no literal {name}")


def find_def(body, name, where):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
    raise Unsupported(f"{where} has no {name}")


def run_def(node, namespace):
    """Defines the function `node` (its decorators and annotations dropped)
    in namespace and returns it."""
    node.decorator_list, node.returns = [], None
    for arg in node.args.args + node.args.kwonlyargs:
        arg.annotation = None
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    exec(compile(module, "<cpp_extension.py>", "exec"), namespace)
    return namespace[node.name]


def calls(node):
    """(function name, first argument's source) of each call under node, in
    source order."""
    found = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    out = []
    for call in found:
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        first = ast.unparse(call.args[0]) if call.args else None
        out.append((name, first, call))
    return out


def is_subsequence(wanted, seen):
    it = iter(seen)
    return all(any(item == s for s in it) for item in wanted)


class Release:
    """One release's flag logic, from the text of its cpp_extension.py."""

    def __init__(self, torch_root, cuda_home):
        path = os.path.join(torch_root, "utils", "cpp_extension.py")
        where = path
        with open(path) as f:
            source = f.read()
        tree = ast.parse(source)
        for rule in (HOST_RULE, CUDA_RULE):
            if rule not in source:
                raise Unsupported(f"{where}: no ninja rule with '{rule}'")
        self.common_nvcc_flags = literal_list(tree, "COMMON_NVCC_FLAGS", where)

        namespace = {
            "os": os, "re": re, "collections": collections, "_TORCH_PATH": torch_root,
            "IS_HIP_EXTENSION": False, "CUDNN_HOME": None,
            "COMMON_NVCC_FLAGS": self.common_nvcc_flags,
            "_join_cuda_home": lambda *parts: os.path.join(cuda_home, *parts),
        }
        self.include_paths = run_def(find_def(tree.body, "include_paths", where), namespace)
        self.arch_flags = run_def(find_def(tree.body, "_get_cuda_arch_flags", where), namespace)

        build = find_def(find_def(tree.body, "BuildExtension", where).body,
                         "build_extensions", where)
        nested = {n.name: n for n in build.body if isinstance(n, ast.FunctionDef)}
        std_names = [name for name in nested if name.startswith("append_std")]
        if len(std_names) != 1 or "unix_cuda_flags" not in nested:
            raise Unsupported(f"{where}: build_extensions has no append_std*/unix_cuda_flags")
        std_name = std_names[0]

        class Compiler:
            compiler_type = "unix"

        namespace["self"] = type("BuildExtension", (), {"compiler": Compiler})()
        namespace["_get_cuda_arch_flags"] = self.arch_flags
        self.append_std = run_def(nested[std_name], namespace)
        self.unix_cuda_flags = run_def(nested["unix_cuda_flags"], namespace)

        ninja = nested.get("unix_wrap_ninja_compile")
        order = [(name, first) for name, first, _ in calls(ninja)] if ninja else []
        wanted = [(std_name, "post_cflags"), ("unix_cuda_flags", "cuda_post_cflags"),
                  (std_name, "cuda_post_cflags")]
        if not is_subsequence(wanted, order):
            raise Unsupported(f"{where}: unix_wrap_ninja_compile no longer calls "
                              f"{std_name}/unix_cuda_flags as replayed here")

        # The flags build_extensions adds to every list of extra_compile_args:
        # statements directly in its `for extension in self.extensions` loop.
        self.added_flags, self.left_out = [], []
        loop = next(n for n in build.body if isinstance(n, ast.For)
                    and ast.unparse(n.iter) == "self.extensions")
        for statement in loop.body:
            if isinstance(statement, ast.If):
                continue  # py_limited_api, ROCm: not this build
            for name, _, call in calls(statement):
                if name == "_add_compile_flag" and isinstance(call.args[1], ast.Constant):
                    self.added_flags.append(call.args[1].value)
                elif name == "_define_torch_extension_name":
                    self.added_flags.append(
                        f"-DTORCH_EXTENSION_NAME={EXTENSION_NAME.split('.')[-1]}")
                elif name in ("_add_compile_flag", "_add_gnu_cpp_abi_flag"):
                    self.left_out.append(ast.unparse(statement).splitlines()[-1].strip())


def setup_flags(setup_path):
    with open(setup_path) as f:
        tree = ast.parse(f.read())
    return (literal_list(tree, "CXX_FLAGS", setup_path),
            literal_list(tree, "NVCC_FLAGS", setup_path))


def python_cflags():
    """distutils' compiler_so for this interpreter, less the compiler."""
    return (sysconfig.get_config_var("CFLAGS") or "").split() + \
        (sysconfig.get_config_var("CCSHARED") or "").split()


def command(kind, release, cxx_flags, nvcc_flags, root, late_includes):
    compat = os.path.join(root, "aten_kernels", "compat", "include")
    cuda = kind != "cpu"
    macros = ["-DDETGRID_WITH_CUDA"] if cuda else []
    include_dirs = [compat] + release.include_paths("cuda" if cuda else "cpu") + \
        [sysconfig.get_paths()["include"]]
    pp_opts = macros + [f"-I{d}" for d in include_dirs]

    # setup.py's extension(): extra_compile_args, then build_extensions' own.
    cxx = cxx_flags + ([f"-idirafter{d}" for d in late_includes] if cuda else [])
    nvcc = nvcc_flags + [f"-Xcompiler=-idirafter{d}" for d in late_includes]
    cxx, nvcc = cxx + release.added_flags, nvcc + release.added_flags

    if kind == "nvcc":
        post = release.unix_cuda_flags(nvcc)
        release.append_std(post)
        return pp_opts + ["-c", "@SOURCE@", "-o", "/dev/null"] + post
    post = list(cxx)
    release.append_std(post)
    return python_cflags() + pp_opts + ["-fsyntax-only", "@SOURCE@"] + post


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-root", required=True, help="the release's torch/ folder")
    parser.add_argument("--setup", required=True, help="detgrid's setup.py")
    parser.add_argument("--root", required=True, help="the checkout (aten_kernels/)")
    parser.add_argument("--cuda-home", required=True)
    parser.add_argument("--late-include", action="append", default=[])
    parser.add_argument("--out", required=True, help="folder for the .args files")
    args = parser.parse_args(argv)
    os.environ["TORCH_CUDA_ARCH_LIST"] = ARCH_LIST
    for name in ("CC", "CUDA_INC_PATH"):  # what an unset environment gives
        os.environ.pop(name, None)
    try:
        release = Release(args.torch_root, args.cuda_home)
        cxx_flags, nvcc_flags = setup_flags(args.setup)
    except (OSError, SyntaxError, ValueError, Unsupported) as e:
        sys.exit(f"old_torch_flags: {e}")
    if not os.path.isdir(args.out):
        sys.exit(f"old_torch_flags: --out {args.out}: no such folder")
    for statement in release.left_out:
        print(f"old_torch_flags: left out (its value comes from the torch binary): {statement}",
              file=sys.stderr)
    for kind in ("cpu", "cuda", "nvcc"):
        out = command(kind, release, cxx_flags, nvcc_flags, args.root, args.late_include)
        with open(os.path.join(args.out, f"{kind}.args"), "w") as f:
            f.write("".join(arg + "\0" for arg in out))


if __name__ == "__main__":
    main()
