#!/usr/bin/env python3
"""check_deploy.py — consistency checks of deploy/ that no outside tool makes.

Run by tests/check_deploy.sh (which runs systemd-analyze, shellcheck and the
Kubernetes schema validation) with the oracle venv's Python (PyYAML comes
with kubernetes-validate):

  check_deploy.py SOURCE_DIR BUILD_DIR

Checks, each printing one line per problem:
  units      every option in a unit's ExecStart, with the example env files
             of deploy/systemd/env/ filled in, is one the binary's --help lists
  slurm      the options after each "$bin/specd-ROLE" of the batch script are
             in that binary's --help
  k8s        every container's role is one the entrypoint knows and its
             options are in that binary's --help; Services select pods that
             exist; a verifier StatefulSet's --tp equals its replicas and its
             SPECD_GROUP_LEADER names its pod 0 under its headless Service
  container  the Containerfile copies every folder the build adds, COPY
             sources exist, the built targets and the paths copied out of the
             build stage are the build tree's, the runtime stage installs the
             Debian package of every shared library the binaries load, and the
             build stage every build package of scripts/setup
Every option a deploy file passes (the CurveZMQ key options included) must be
in the binary's --help: anything else is a failure.
Exit status: 0 all good, 1 a problem.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

import yaml

BINARIES = {  # role -> path under the build tree
    "coordinator": "coordinator/specd-coordinator",
    "verifier": "verifier/specd-verifier",
    "drafter": "drafter/specd-drafter",
    "gateway": "gateway/specd-gateway",
    "client": "client/specd-client",
    "launch": "deploy/specd-launch",
}
# Tools the deploy files run besides the service binaries (--help checked only;
# not in the image).
TOOLS = {"keygen": "tools/specd-keygen"}

problems = []
notes = []


def problem(where, what):
    problems.append(f"{where}: {what}")


class Helps:
    """Each binary's --help, run once; the options it lists."""

    def __init__(self, build):
        self.build = build
        self.cache = {}

    def options(self, role):
        if role not in self.cache:
            path = os.path.join(self.build, {**BINARIES, **TOOLS}[role])
            out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
            self.cache[role] = set(re.findall(r"--[a-z0-9][a-z0-9-]*", out.stdout + out.stderr))
        return self.cache[role]

    def check(self, where, role, words, added=()):
        known = self.options(role) | set(added)
        for w in words:
            if not w.startswith("--"):
                continue
            opt = w.split("=", 1)[0]
            if opt not in known:
                problem(where, f"specd-{role} has no option {opt} (see its --help)")


# ---- systemd units ----

def read_env(path, env):
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        k, _, v = line.partition("=")
        env[k.strip()] = v.strip().strip('"')


def unit_execstart(path):
    """(ExecStart words, EnvironmentFile= entries (path, optional), Environment= pairs)
    of a unit, continuation lines joined."""
    text = re.sub(r"\\\n", " ", open(path).read())
    exec_line, env_files, env_lines = None, [], []
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            exec_line = line[len("ExecStart="):]
        elif line.startswith("EnvironmentFile="):
            f = line[len("EnvironmentFile="):]
            env_files.append((f.lstrip("-"), f.startswith("-")))
        elif line.startswith("Environment="):
            for assignment in shlex.split(line[len("Environment="):]):
                k, _, v = assignment.partition("=")
                env_lines.append((k, v))
    return exec_line, env_files, env_lines


def expand(words, env, instance):
    """systemd's expansion: ${VAR} is one word, $VAR splits on whitespace; %i, %H."""
    out = []
    for w in words:
        w = w.replace("%i", instance).replace("%H", "host")
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
        if m:
            out.extend(env.get(m.group(1), "").split())
            continue
        out.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), w))
    return out


def check_units(src, helps):
    sysd = os.path.join(src, "deploy/systemd")
    for name in sorted(os.listdir(sysd)):
        if not name.endswith(".service"):
            continue
        path = os.path.join(sysd, name)
        exec_line, env_files, env_lines = unit_execstart(path)
        if not exec_line:
            problem(f"deploy/systemd/{name}", "no ExecStart=")
            continue
        # a template is checked for every instance with example per-instance
        # env files (verifier@0.env, verifier@1.env: rank 0 and the others), or 0
        instances = ["0"]
        if name.endswith("@.service"):
            found = set()
            for f, _ in env_files:
                base = os.path.basename(f)
                if "%i" in base:
                    pat = re.escape(base).replace("%i", "([0-9]+)")
                    found |= {m.group(1) for e in os.listdir(os.path.join(sysd, "env"))
                              if (m := re.fullmatch(pat, e))}
            instances = sorted(found) or ["0"]
        for inst in instances:
            check_unit_instance(sysd, name, inst, exec_line, env_files, env_lines, helps)


def check_unit_instance(sysd, name, inst, exec_line, env_files, env_lines, helps):
    where = f"deploy/systemd/{name}" + (f" (instance {inst})" if name.endswith("@.service") else "")
    unit = name.replace("@.", f"@{inst}.")
    # Environment= first (specifiers expanded; %d is the credentials
    # directory), then the env files in order, as systemd does
    env = {k: v.replace("%i", inst).replace("%d", f"/run/credentials/{unit}") for k, v in env_lines}
    for f, optional in env_files:
        base = os.path.basename(f).replace("%i", inst)
        example = os.path.join(sysd, "env", base)
        if not os.path.exists(example):
            if not optional:
                problem(where, f"EnvironmentFile={f} has no example deploy/systemd/env/{base}")
            continue
        read_env(example, env)
    words = expand(shlex.split(exec_line), env, inst)
    binary = os.path.basename(words[0])
    role = binary[len("specd-"):] if binary.startswith("specd-") else None
    if role not in BINARIES:
        problem(where, f"ExecStart runs {words[0]}, not a specd binary")
        return
    if words[0] != f"/opt/specd/bin/{binary}":
        problem(where, f"ExecStart runs {words[0]}; the units install to /opt/specd/bin")
    for w in words:
        if w == "":
            problem(where, "an ExecStart variable is empty in the example env files")
    helps.check(where, role, words[1:])


# ---- Slurm ----

def check_slurm(src, helps):
    """Options after each "$bin/specd-ROLE" in the batch script (to the end of its command)."""
    where = "deploy/slurm/specd.sbatch"
    text = re.sub(r"\\\n", " ", open(os.path.join(src, where)).read())
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for m in re.finditer(r'"\$bin/specd-([a-z]+)"([^&|;]*)', line):
            role = m.group(1)
            if role not in BINARIES and role not in TOOLS:
                problem(where, f"runs specd-{role}, not a specd binary")
                continue
            words = re.findall(r"(?<![\w$])--[a-z0-9][a-z0-9-]*", m.group(2))
            helps.check(where, role, words)
    # the key arrays, and what each rank adds to the verifier's flags
    # (rank_script: --rank, --device and the rank's keys)
    blocks = {"coordinator_keys": "coordinator", "drafter_keys": "drafter", "gateway_keys": "gateway",
              "rank_script": "verifier"}
    for var, role in blocks.items():
        m = re.search(rf"^{var}=(\((.*?)\)|'(.*?)')", text, re.M | re.S)
        if not m:
            problem(where, f"no {var}=... block")
            continue
        helps.check(f"{where} ({var})", role, re.findall(r"(?<![\w$])--[a-z0-9][a-z0-9-]*", m.group(1)))


# ---- Kubernetes ----

def check_k8s(src, helps):
    docs = []
    kdir = os.path.join(src, "deploy/k8s")
    for name in sorted(os.listdir(kdir)):
        if name.endswith((".yaml", ".yml")):
            for d in yaml.safe_load_all(open(os.path.join(kdir, name))):
                if d:
                    docs.append((f"deploy/k8s/{name}", d))
    entrypoint = open(os.path.join(src, "deploy/container/specd-entrypoint")).read()
    # the options the entrypoint adds to the verifier's (SPECD_RANK,
    # SPECD_GROUP_LEADER, SPECD_GROUP_KEYS): in its rank_flags lines
    added = set(re.findall(r"(?<![\w$])--[a-z0-9][a-z0-9-]*",
                           "\n".join(l for l in entrypoint.splitlines() if "rank_flags" in l and "=" in l)))
    helps.check("deploy/container/specd-entrypoint (rank_flags)", "verifier", sorted(added))
    entrypoint_adds = {"verifier": added}
    workloads = [(w, d) for w, d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    services = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "Service"}
    configmaps = {d["metadata"]["name"] for _, d in docs if d["kind"] == "ConfigMap"}
    for where, d in workloads:
        spec = d["spec"]
        tmpl = spec["template"]
        labels = tmpl["metadata"].get("labels", {})
        for k, v in spec["selector"]["matchLabels"].items():
            if labels.get(k) != v:
                problem(where, f"{d['metadata']['name']}: the selector's {k}={v} is not on its pods")
        for c in tmpl["spec"]["containers"]:
            args = c.get("args", [])
            if not args or args[0] not in BINARIES or not re.search(rf"\b{args[0]}\b", entrypoint):
                problem(where, f"container {c['name']}: first argument {args[:1]} is not an entrypoint role")
                continue
            role = args[0]
            helps.check(f"{where} ({c['name']})", role, args[1:], entrypoint_adds.get(role, ()))
            env_names = {e["name"] for e in c.get("env", [])}
            for ref in c.get("envFrom", []):
                cm = ref.get("configMapRef", {}).get("name")
                if cm and cm not in configmaps:
                    problem(where, f"container {c['name']}: no ConfigMap {cm} in deploy/k8s")
                if cm:
                    env_names |= set(next(x for _, x in docs if x["kind"] == "ConfigMap"
                                          and x["metadata"]["name"] == cm)["data"])
            for a in args:
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                    if var not in env_names:
                        problem(where, f"container {c['name']}: $({var}) is not in its environment")
            if d["kind"] == "StatefulSet" and role == "verifier":
                svc = spec.get("serviceName")
                if svc not in services or services[svc]["spec"].get("clusterIP") != "None":
                    problem(where, f"{d['metadata']['name']}: serviceName {svc} is not a headless Service here")
                tp = args[args.index("--tp") + 1] if "--tp" in args else "1"
                if int(tp) != int(spec.get("replicas", 1)):
                    problem(where, f"{d['metadata']['name']}: --tp {tp} but {spec.get('replicas', 1)} replicas (one pod per rank)")
                env = {e["name"]: e for e in c.get("env", [])}
                leader = env.get("SPECD_GROUP_LEADER", {}).get("value", "")
                want = f"{d['metadata']['name']}-0.{svc}:"
                if int(tp) > 1 and not leader.startswith(want):
                    problem(where, f"SPECD_GROUP_LEADER {leader!r} is not pod 0 of the group ({want}PORT)")
                if "SPECD_RANK" not in env:
                    problem(where, "a verifier StatefulSet needs SPECD_RANK (the pod index)")
            if role == "gateway":
                probe = c.get("readinessProbe", {})
                cmd = probe.get("exec", {}).get("command", [])
                if "health" not in cmd and probe.get("httpGet", {}).get("path") != "/health":
                    problem(where, "the gateway's readiness probe does not ask /health")
    for name, s in services.items():
        sel = s["spec"].get("selector", {})
        if not any(all(w["spec"]["template"]["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())
                   for _, w in workloads):
            problem("deploy/k8s", f"Service {name} selects no pods of deploy/k8s ({sel})")


# ---- Containerfile ----

def debian_package(lib):
    """The Debian package holding a shared library by its soname, or None."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == lib:
            path = parts[-1]
            for p in (path, "/usr" + path, path.removeprefix("/usr")):
                r = subprocess.run(["dpkg-query", "-S", p], capture_output=True, text=True)
                if r.returncode == 0:
                    return r.stdout.split(":")[0].strip()
            return None
    return None


def apt_installs(stage_text):
    pkgs = []
    for m in re.finditer(r"apt-get install([^&]*)", stage_text):
        pkgs += [w for w in m.group(1).replace("\\", " ").split() if not w.startswith("-")]
    return set(pkgs)


def check_container(src, build):
    where = "deploy/Containerfile"
    text = open(os.path.join(src, where)).read()
    joined = re.sub(r"\\\n", " ", text)
    stages = re.split(r"^FROM ", joined, flags=re.M)[1:]
    if len(stages) != 2:
        problem(where, f"{len(stages)} stages, expected 2 (build, runtime)")
        return
    build_stage, runtime_stage = stages
    if not re.match(r"\$\{BUILD_IMAGE\}|debian:bookworm", build_stage) or "ARG BUILD_IMAGE=debian:bookworm" not in text:
        problem(where, "the build stage is not Debian bookworm")
    if "ARG RUNTIME_IMAGE=debian:bookworm" not in text:
        problem(where, "the runtime stage is not Debian bookworm")
    copied = set()
    for line in joined.splitlines():
        m = re.match(r"COPY\s+(.*)", line.strip())
        if not m:
            continue
        words = m.group(1).split()
        if words[0].startswith("--from="):
            for p in words[1:-1]:
                rel = p.removeprefix("/src/build/")
                if rel == p:
                    problem(where, f"COPY --from=build {p}: not under the build tree /src/build")
                elif not os.path.isfile(os.path.join(build, rel)):
                    problem(where, f"COPY --from=build {p}: the build makes no {rel}")
            continue
        words = [w for w in words if not w.startswith("--")]
        for p in words[:-1]:
            if not os.path.exists(os.path.join(src, p)):
                problem(where, f"COPY {p}: not in the repository")
            copied.add(p.rstrip("/"))
    # every folder the build adds must be in the image's source
    for entry in sorted(os.listdir(src)):
        if os.path.isfile(os.path.join(src, entry, "CMakeLists.txt")) and entry not in copied:
            problem(where, f"{entry}/ has a CMakeLists.txt but is not copied into the build stage")
    if "CMakeLists.txt" not in copied:
        problem(where, "the top-level CMakeLists.txt is not copied")
    # the targets built are the binaries copied out, and exist
    m = re.search(r"--target\s+([^\n&]*)", build_stage)
    targets = set(m.group(1).split()) if m else set()
    for role, rel in BINARIES.items():
        name = os.path.basename(rel)
        if name not in targets:
            problem(where, f"the build stage does not build {name}")
        if f"/src/build/{rel}" not in runtime_stage:
            problem(where, f"the runtime stage does not copy {rel} out of the build stage")
    if "COPY deploy/container/specd-entrypoint" not in runtime_stage or "specd-entrypoint" not in runtime_stage.split("ENTRYPOINT")[-1]:
        problem(where, "the entrypoint is not deploy/container/specd-entrypoint")
    if not os.access(os.path.join(src, "deploy/container/specd-entrypoint"), os.X_OK):
        problem(where, "deploy/container/specd-entrypoint is not executable")
    # runtime libraries: the Debian package of each library a binary loads
    runtime_pkgs = apt_installs(runtime_stage)
    base = {"libc6", "libgcc-s1"}  # in every Debian image
    needed = set()
    for rel in BINARIES.values():
        out = subprocess.run(["objdump", "-p", os.path.join(build, rel)], capture_output=True, text=True).stdout
        needed |= set(re.findall(r"NEEDED\s+(\S+)", out))
    sanitizer = re.compile(r"lib(asan|ubsan|tsan|lsan)\.so")
    # a build with CUDA (SPECD_CUDA=AUTO finds nvcc) loads the toolkit's
    # libraries: not Debian packages, and the image is a CPU build
    cuda = re.compile(r"lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc|nvJitLink|curand|cusparse|cufft)\.so")
    if not shutil.which("dpkg-query") or not (shutil.which("ldconfig") or os.path.exists("/sbin/ldconfig")):
        notes.append(f"{where}: no dpkg-query or ldconfig here (not Debian?): the runtime libraries were not checked")
    else:
        for lib in sorted(needed):
            if sanitizer.match(lib):
                continue
            if cuda.match(lib):
                notes.append(f"{where}: {lib} (CUDA toolkit) not checked: the image is a CPU build (SPECD_CUDA=OFF)")
                continue
            pkg = debian_package(lib)
            if pkg is None:
                problem(where, f"{lib}: no Debian package found for it")
            elif pkg not in base and pkg not in runtime_pkgs:
                problem(where, f"the binaries load {lib} ({pkg}), which the runtime stage does not install")
    # build packages: what scripts/setup installs for the build
    setup = open(os.path.join(src, "scripts/setup")).read()
    m = re.search(r"pkgs=\(([^)]*)\)", setup)
    setup_pkgs = set(m.group(1).split()) if m else set()
    build_pkgs = apt_installs(build_stage)
    for p in sorted(setup_pkgs):
        if (p.endswith("-dev") or p in ("cmake", "ninja-build", "pkg-config", "protobuf-c-compiler",
                                        "build-essential")) and p not in build_pkgs:
            problem(where, f"scripts/setup installs {p} for the build, the build stage does not")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    src, build = sys.argv[1], sys.argv[2]
    helps = Helps(build)
    check_units(src, helps)
    check_slurm(src, helps)
    check_k8s(src, helps)
    check_container(src, build)
    for n in notes:
        print("note:", n)
    for p in problems:
        print("FAIL:", p)
    print(f"check_deploy.py: {len(problems)} problem(s), {len(notes)} note(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
