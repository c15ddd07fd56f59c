"""The Python helpers of tests/cluster, the one definition of each (lib.sh is the shell
side): imported by scenario-workloads.py, scenario-rules.py, bench-startup.py and
plan-agreement.py. Quantities and YAML files; the cluster's environment (DIR/env,
DIR/tessera/env), read on first use of DIR, ENV or KUBECTL from the script's one
argument, DIR; kubectl and ctr; printed checks; polling; the CUDA client image; the
plugin's node config and metrics.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from fractions import Fraction

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GIB = 1 << 30
IMAGE = "localhost/tessera/cuda-client:1"
CLIENT = "/usr/local/bin/cuda_client"


def read_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                env[k] = v
    return env


def load_cluster():
    """Sets DIR (the script's one argument, absolute), ENV (DIR/env and DIR/tessera/env)
    and KUBECTL; once. Exits with the usage unless there is exactly one argument."""
    global DIR, ENV, KUBECTL
    if "KUBECTL" in globals():
        return
    if len(sys.argv) != 2:
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} DIR")
    DIR = os.path.abspath(sys.argv[1])
    ENV = read_env(f"{DIR}/env")
    ENV.update(read_env(f"{DIR}/tessera/env"))
    KUBECTL = [f"{ENV['K8S_BIN']}/kubectl", "--kubeconfig", ENV["KUBECONFIG"]]


def __getattr__(name):
    """DIR, ENV and KUBECTL, read on first use (`from scenario_lib import DIR` too), so
    that a script of another command line (plan-agreement.py) can import the rest."""
    if name in ("DIR", "ENV", "KUBECTL"):
        load_cluster()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The number of failed checks so far (read it as scenario_lib.errors).
errors = 0

QUANTITY_SUFFIX = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}


def quantity(s):
    """A Kubernetes quantity string as an exact number: an int when whole, else a
    Fraction. ValueError when it is not a quantity."""
    m = re.fullmatch(r"([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)", str(s).strip())
    if not m:
        raise ValueError(f"not a quantity: {s!r}")
    v = Fraction(m.group(1))
    if m.group(2):
        v *= Fraction(10) ** int(m.group(2)[1:])
    v *= QUANTITY_SUFFIX[m.group(3) or ""]
    return int(v) if v.denominator == 1 else v


def load_docs(path):
    """The documents of a YAML file, empty ones left out."""
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def run_kubectl(args, stdin=None):
    """kubectl ARGS; an exec that runc could not start ("OCI runtime exec failed", a
    transient of runc under load) is tried again, at most 3 times, saying so."""
    load_cluster()
    for attempt in range(1, 4):
        r = subprocess.run(KUBECTL + list(args), input=stdin, capture_output=True, text=True)
        if r.returncode == 0 or "OCI runtime exec failed" not in r.stderr or attempt == 3:
            return r
        print(f"  (runc could not start the exec, attempt {attempt}: {r.stderr.strip().splitlines()[-1]}; again)",
              file=sys.stderr, flush=True)
        time.sleep(1)


def k(*args, check=True, stdin=None):
    r = run_kubectl(args, stdin)
    if check and r.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def kj(*args):
    return json.loads(k(*args, "-o", "json"))


def ok(what):
    print(f"  ok   {what}", flush=True)


def fail(what):
    global errors
    errors += 1
    print(f"  FAIL {what}", file=sys.stderr, flush=True)


def expect(cond, what, detail=""):
    if cond:
        ok(what)
    else:
        fail(f"{what}{': ' + detail if detail else ''}")
    return cond


def wait(what, fn, timeout=90, step=0.2):
    """Polls fn until it returns a true value; returns it (or None after timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            return None
        time.sleep(step)


def reload_env():
    """DIR/tessera/env again (node-config.sh replaces the plugin pod and renames it)."""
    load_cluster()
    ENV.update(read_env(f"{DIR}/tessera/env"))


def node_config(*args):
    """node-config.sh DIR ARGS...: save, mock-node or use a node config."""
    load_cluster()
    subprocess.run([f"{HERE}/node-config.sh", DIR] + list(args), check=True)
    reload_env()


@contextlib.contextmanager
def simulated_node_config(out, **extra):
    """Runs the body with the plugin on the simulated node's own node config (gpu-1
    `shared`: the one the examples' `# expect:` lines are planned against), with the
    top-level fields EXTRA added (health=...), and puts the installed one back
    afterwards, also when the body fails. Both are kept in OUT."""
    installed, mock = f"{out}/node-config.installed.yaml", f"{out}/node-config.mock-node.yaml"
    node_config("save", installed)
    node_config("mock-node", mock)
    if extra:
        with open(mock) as f:
            doc = yaml.safe_load(f)
        doc.update(extra)
        with open(mock, "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
    node_config("use", mock)
    try:
        yield
    finally:
        print("--- restoring the installed node config", flush=True)
        node_config("use", installed)


def client(ns, pod, container, *cmds):
    """cuda_client's result lines in the container (and the completed process)."""
    r = run_kubectl(["-n", ns, "exec", pod, "-c", container, "--", CLIENT, "gpa"] + list(cmds))
    return [l for l in r.stdout.splitlines() if l.startswith(("ok", "err", "holding"))], r


def ctr(*args, check=False):
    """ctr ARGS in the cluster's containerd (its mount namespace, namespace k8s.io), as
    lib.sh kctr: the completed process, output captured."""
    load_cluster()
    with open(f"{DIR}/pids/containerd") as f:
        pid = f.read().strip()
    return subprocess.run(["nsenter", "--mount", "--target", pid, "ctr", "--address", ENV["CONTAINERD_SOCKET"],
                           "--namespace", "k8s.io"] + list(args), capture_output=True, text=True, check=check)


def metrics_text():
    """The plugin's /metrics, as text."""
    load_cluster()
    return urllib.request.urlopen(f"http://127.0.0.1:{ENV['METRICS_PORT']}/metrics", timeout=10).read().decode()


def metric(name):
    """A counter of the plugin's /metrics (the sum of its series)."""
    text = metrics_text()
    return sum(float(l.split()[-1]) for l in text.splitlines()
               if l.startswith(name) and (l[len(name)] in " {" or l[len(name):].startswith("_total")))


# ---------- the objects the scenarios create ----------
def claim_doc(ns, name, exactly):
    """ResourceClaim NAME in NS with one request `gpu`; EXACTLY is its device request
    (`deviceClassName`, and `capacity`, `selectors`, `count` as needed)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def pod_doc(ns, name, claim=None, grace=1, labels=None, env=None, mounts=None, volumes=None):
    """Pod NAME in NS: one container `main` of the client image (its entrypoint holds),
    given ResourceClaim CLAIM (none without); GRACE its termination grace period (1 s:
    the entrypoint exits on SIGTERM, and the namespace controller waits about half the
    grace period of a namespace's running pods before it looks again, 16 s for the default
    30; None: the default); ENV, MOUNTS, VOLUMES the container's environment and volume
    mounts, the pod's volumes."""
    main = {"name": "main", "image": IMAGE, "imagePullPolicy": "Never"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": {"containers": [main]}}
    if labels:
        pod["metadata"]["labels"] = labels
    if claim:
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        main["resources"] = {"claims": [{"name": "gpu"}]}
    if grace is not None:
        pod["spec"]["terminationGracePeriodSeconds"] = grace
    if env:
        main["env"] = env
    if mounts:
        main["volumeMounts"] = mounts
    if volumes:
        pod["spec"]["volumes"] = volumes
    return pod


# ---------- the simulated node ----------
def simulated_node():
    """The simulated node as mock-node-root.sh made it (DIR/tessera-node/node.json):
    backend (`mock`, or `nvml:MODEL`: the shipped backend on NVIDIA's model), driverVersion,
    charDevices, and gpus in minor order (minor, uuid, productName, memoryBytes, migCapable)."""
    load_cluster()
    with open(f"{DIR}/tessera-node/node.json") as f:
        return json.load(f)


def mig_instances():
    """Every MIG GPU instance the simulated node has now, one string each: from the mock
    node's state file, or from NVIDIA's model's state (`nvml-model dump`, which takes the
    model's lock: a consistent view beside the plugin). Reads only."""
    if simulated_node()["backend"] == "mock":
        with open(f"{DIR}/tessera-node/state/mock-node.state") as f:
            return [l.strip() for l in f if l.startswith("mig-gi ")]
    return [f"gpu {g['minor']} gi {gi['id']} profile {gi['profileId']} start {gi['placement']['start']} "
            f"({', '.join(ci['uuid'] for ci in gi['computeInstances']) or 'no compute instance'})"
            for g in model_dump()["gpus"] for gi in g["gpuInstances"]]


def model_dump():
    """NVIDIA's model as it is now (`nvml-model dump` on the node's model state, under
    the model's lock: a consistent view beside the plugin): GPUs with their GPU instances
    and those's compute instances and MIG UUIDs. Only on an `nvml:MODEL` node."""
    backend = simulated_node()["backend"]
    env = dict(os.environ, TESSERA_NVML_MODEL=backend.split(":", 1)[1],
               TESSERA_NVML_MODEL_STATE=f"{DIR}/tessera-node/state/nvml-model")
    return json.loads(subprocess.run([f"{REPO}/target/tmp/nvml-models/nvml-model", "dump"], env=env,
                                     capture_output=True, text=True, check=True).stdout)


def mock_only(what, why):
    """True, printing that WHAT is not run here and WHY, when the node is not the mock
    node: the checks that need an event or a process only the mock backend can simulate
    (tests/nvml-models' README: XID events and per-process memory are not modelled).
    The mock-backend runs of tests/real_cluster.rs keep them."""
    backend = simulated_node()["backend"]
    if backend == "mock":
        return False
    print(f"  not run on {backend}: {what}: {why} (the mock-backend clusters run it)", flush=True)
    return True


# ---------- the client image ----------
def build_image():
    """localhost/tessera/cuda-client:1 in the cluster's containerd: busybox, the host's
    glibc, cuda_client, bypass (bypass.c: linked statically with a driver of its own), entrypoint
    `hold` (stays up, ignores its arguments), and the
    fake driver's environment: the simulated node's GPUs in minor order, shown only where the
    container has their device node (FAKE_CUDA_DEVICE_NODES=1, as the real driver)."""
    load_cluster()
    gpus = simulated_node()["gpus"]
    assert [g["minor"] for g in gpus] == list(range(len(gpus))), "minors 0..n-1 (FAKE_CUDA_DEVICE_NODES)"
    devices = ",".join(f"{g['uuid']}:{g['memoryBytes']}" for g in gpus)
    root = f"{DIR}/images/cuda-client-rootfs"
    shutil.rmtree(root, ignore_errors=True)
    for d in ["bin", "etc", "dev", "proc", "sys", "tmp", "lib64", "lib/x86_64-linux-gnu", "usr/local/bin"]:
        os.makedirs(f"{root}/{d}", exist_ok=True)
    os.chmod(f"{root}/tmp", 0o1777)
    shutil.copy2(f"{ENV['TESSERA_CLUSTER_ROOT']}/bin/busybox", f"{root}/bin/busybox")
    applets = subprocess.run([f"{root}/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout
    for a in applets.split():
        if a != "busybox":
            os.symlink("busybox", f"{root}/bin/{a}")
    for lib in ["libc.so.6", "ld-linux-x86-64.so.2"]:
        shutil.copy2(f"/lib/x86_64-linux-gnu/{lib}", f"{root}/lib/x86_64-linux-gnu/{lib}")
    os.symlink("../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", f"{root}/lib64/ld-linux-x86-64.so.2")
    subprocess.run(["cc", "-std=gnu11", "-O1", "-o", f"{root}/usr/local/bin/cuda_client",
                    f"{REPO}/cuda/tests/fakes/cuda_client.c", "-ldl"], check=True)
    subprocess.run(["cc", "-static", "-std=gnu11", "-O1", "-Wall", "-Werror", "-pthread",
                    f"-I{REPO}/cuda/tests/fakes", "-o", f"{root}/usr/local/bin/bypass", f"{HERE}/bypass.c",
                    f"{REPO}/cuda/tests/fakes/fake_cuda.c"], check=True)
    # The entrypoint: takes whatever arguments the example gives its program, stays up
    # until SIGTERM (the test looks into the running container).
    with open(f"{root}/usr/local/bin/hold", "w") as f:
        f.write("#!/bin/sh\n# tests/cluster: the cuda-client image's entrypoint; ignores its arguments.\n"
                "trap 'exit 0' TERM INT\nsleep 2147483647 &\nwait\n")
    os.chmod(f"{root}/usr/local/bin/hold", 0o755)
    with open(f"{root}/etc/passwd", "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    tar = f"{DIR}/images/cuda-client.tar"
    env_items = f'"FAKE_CUDA_DEVICES={devices}","FAKE_CUDA_DEVICE_NODES=1"'
    subprocess.run(["bash", "-c", f'. "{HERE}/lib.sh"; mkimage "$1" "$2" "$3" "$4" "$5" "$6"', "-",
                    root, IMAGE, tar, "null", '["/usr/local/bin/hold"]', env_items], check=True)
    ctr("images", "import", tar, check=True)
    print(f"image {IMAGE}: busybox, glibc, cuda_client, bypass; FAKE_CUDA_DEVICES={devices}", flush=True)


