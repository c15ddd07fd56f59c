//! The Helm chart (`deploy/helm/tessera`), proved without a cluster with the pinned helm
//! that `tests/cluster/helm/build.sh` builds from its Go module (`target/helm/<version>-<key>/helm`;
//! `TESSERA_HELM` overrides): `helm lint --strict` and `helm template` in every mode, with
//! checks of what each mode changes; `values.schema.json` refusing unknown keys and bad
//! values with a message naming them; and parity with kustomize: for `deploy/base`, each
//! overlay and `deploy/monitoring`, the chart with the values in `tests/data/helm/` renders
//! the same objects as `kubectl kustomize`, after normalising the documented differences
//! (`deploy/helm/tessera/README.md`, "Kustomize parity").
//!
//! Without helm (or kubectl, for the parity test) the tests print SKIPPED and pass, unless
//! `CI` is set: then a missing prerequisite is a failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_model::schedule;
use serde_json::{Value, json};
use tessera::config::NodeConfig;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    root().join("deploy/helm/tessera")
}

/// A missing tool: skipped locally, a failure under CI (the test kit's one rule).
fn skip(what: &str) {
    testkit::prereq::skip_or_fail(what, "build it with tests/cluster/helm/build.sh");
}

/// Where `tests/cluster/helm/build.sh` puts the pinned helm (a directory keyed by the
/// hash of its inputs), as it says with `--path`; `None` when it cannot say (no Go).
fn helm_path() -> Option<PathBuf> {
    let out = Command::new(root().join("tests/cluster/helm/build.sh"))
        .arg("--path")
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let path = String::from_utf8_lossy(&out.stdout);
    Some(PathBuf::from(path.lines().last()?.trim()))
}

struct Helm {
    bin: PathBuf,
    /// HELM_*_HOME: nothing of the user's helm config, cache or plugins is used.
    home: tempfile::TempDir,
}

fn helm() -> Option<Helm> {
    let bin = match std::env::var_os("TESSERA_HELM")
        .map(PathBuf::from)
        .or_else(helm_path)
    {
        Some(p) => p,
        None => {
            skip("tests/cluster/helm/build.sh --path failed (is Go installed?)");
            return None;
        }
    };
    if !bin.is_file() {
        skip(&format!(
            "{} is not built (tests/cluster/helm/build.sh builds it)",
            bin.display()
        ));
        return None;
    }
    Some(Helm {
        bin,
        home: tempfile::tempdir().unwrap(),
    })
}

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Helm {
    fn run(&self, args: &[&str]) -> Run {
        let h = self.home.path();
        let out = Command::new(&self.bin)
            .args(args)
            .env("HELM_CACHE_HOME", h.join("cache"))
            .env("HELM_CONFIG_HOME", h.join("config"))
            .env("HELM_DATA_HOME", h.join("data"))
            .env_remove("KUBECONFIG")
            .output()
            .expect("helm runs");
        Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        }
    }

    /// `helm template tessera deploy/helm/tessera -n NAMESPACE ARGS...`, parsed.
    fn template_ns(&self, ns: &str, args: &[&str]) -> Vec<Value> {
        let chart = chart();
        let mut all = vec!["template", "tessera", chart.to_str().unwrap(), "-n", ns];
        all.extend_from_slice(args);
        let r = self.run(&all);
        assert!(r.ok, "helm {}: {}", all.join(" "), r.stderr);
        // Nothing on stderr: no warning of helm's (symlinks, deprecated APIs, ...).
        assert_eq!(r.stderr, "", "helm {} printed warnings", all.join(" "));
        schedule::documents(&r.stdout, "helm template").unwrap()
    }

    fn template(&self, args: &[&str]) -> Vec<Value> {
        self.template_ns("tessera-system", args)
    }
}

/// The modes the chart has, as helm arguments.
fn modes() -> Vec<(&'static str, Vec<String>)> {
    let data = root().join("tests/data/helm");
    let f = |n: &str| data.join(n).to_str().unwrap().to_string();
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        ("default", vec![]),
        ("mock backend", s(&["--set", "mock.enabled=true"])),
        (
            "test cluster (mock, host network)",
            vec!["-f".into(), f("overlays__test-cluster.yaml")],
        ),
        (
            "watchdog report",
            s(&["--set", "watchdog.mode=report,watchdog.tolerance=1Gi"]),
        ),
        ("watchdog off", s(&["--set", "watchdog.mode=off"])),
        (
            "monitoring on",
            s(&[
                "--set",
                "metrics.podMonitor.enabled=true,metrics.grafanaDashboard.enabled=true",
            ]),
        ),
        (
            "monitoring off",
            s(&["--set", "metrics.prometheusAnnotations=false"]),
        ),
        (
            "device classes off",
            s(&[
                "--set",
                "deviceClasses.gpu.enabled=false,deviceClasses.mig.enabled=false,deviceClasses.shared.enabled=false,deviceClasses.slot.enabled=false",
            ]),
        ),
        (
            "admission policies off",
            s(&[
                "--set",
                "admissionPolicies.resourceSlicesOwnNode=false,admissionPolicies.gpuConfig=false,admissionPolicies.tenantPods=false",
            ]),
        ),
        ("node config", vec!["-f".into(), f("node-config.yaml")]),
        ("namespace created", s(&["--set", "namespace.create=true"])),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn the_chart_lints_strictly_in_every_mode() {
    let Some(helm) = helm() else { return };
    let chart = chart();
    for (mode, args) in modes() {
        let mut all = vec![
            "lint",
            "--strict",
            chart.to_str().unwrap(),
            "-n",
            "tessera-system",
        ];
        all.extend(strs(&args));
        let r = helm.run(&all);
        assert!(
            r.ok,
            "helm lint --strict ({mode}):\n{}{}",
            r.stdout, r.stderr
        );
        assert!(
            r.stdout.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{mode}: {}",
            r.stdout
        );
        eprintln!("lint --strict ok: {mode}");
    }
}

fn key(o: &Value) -> String {
    format!(
        "{}/{}",
        o["kind"].as_str().unwrap(),
        o["metadata"]["name"].as_str().unwrap()
    )
}

fn keys(objs: &[Value]) -> Vec<String> {
    let mut k: Vec<String> = objs.iter().map(key).collect();
    k.sort();
    k
}

fn get<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {:?}", keys(objs)))
}

fn container(objs: &[Value]) -> &Value {
    &get(objs, "DaemonSet", "tessera-plugin")["spec"]["template"]["spec"]["containers"][0]
}

fn args(objs: &[Value]) -> Vec<String> {
    container(objs)["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn env(objs: &[Value], name: &str) -> Option<String> {
    container(objs)["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap_or_default().to_string())
}

fn volume_path(objs: &[Value], name: &str) -> String {
    get(objs, "DaemonSet", "tessera-plugin")["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name}"))["hostPath"]["path"]
        .as_str()
        .unwrap()
        .to_string()
}

fn pod_annotations(objs: &[Value]) -> serde_json::Map<String, Value> {
    get(objs, "DaemonSet", "tessera-plugin")["spec"]["template"]["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

fn node_config(objs: &[Value]) -> NodeConfig {
    let text = get(objs, "ConfigMap", "tessera-node-config")["data"]["node-config.yaml"]
        .as_str()
        .unwrap();
    NodeConfig::from_yaml(text, "the chart's tessera-node-config")
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The plugin's own defaults (src/main.rs), which the chart leaves implicit.
fn plugin_default(flag_env: &str) -> String {
    let main = std::fs::read_to_string(root().join("src/main.rs")).unwrap();
    let line = main
        .lines()
        .find(|l| l.contains(flag_env) && l.contains("default_value"))
        .unwrap_or_else(|| panic!("no default for {flag_env} in src/main.rs"));
    line.split("default_value = \"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn helm_template_renders_what_each_mode_asks_for() {
    let Some(helm) = helm() else { return };
    let default = helm.template(&[]);
    // The default objects: the base's less the Namespace (helm install --create-namespace).
    assert_eq!(
        keys(&default),
        [
            "ClusterRole/tessera-plugin",
            "ClusterRoleBinding/tessera-plugin",
            "ConfigMap/tessera-node-config",
            "DaemonSet/tessera-plugin",
            "DeviceClass/gpu.tessera.dev",
            "DeviceClass/mig.tessera.dev",
            "DeviceClass/shared.tessera.dev",
            "DeviceClass/slot.tessera.dev",
            "ServiceAccount/tessera-plugin",
            "ValidatingAdmissionPolicy/tessera-gpuconfig",
            "ValidatingAdmissionPolicy/tessera-resourceslices-own-node",
            "ValidatingAdmissionPolicy/tessera-tenant-pods",
            "ValidatingAdmissionPolicyBinding/tessera-gpuconfig",
            "ValidatingAdmissionPolicyBinding/tessera-resourceslices-own-node",
            "ValidatingAdmissionPolicyBinding/tessera-tenant-pods",
        ]
    );
    for o in &default {
        let l = &o["metadata"]["labels"];
        assert_eq!(l["app.kubernetes.io/managed-by"], "Helm", "{}", key(o));
        assert_eq!(l["app.kubernetes.io/instance"], "tessera", "{}", key(o));
    }
    // The defaults the chart leaves to the binary are the binary's.
    let a = args(&default);
    assert_eq!(a[0], "--backend=nvml");
    assert!(!a.iter().any(|a| a.starts_with("--watchdog")), "{a:?}");
    assert_eq!(plugin_default("env = \"TESSERA_WATCHDOG\""), "enforce");
    assert_eq!(plugin_default("parse_tolerance"), "256Mi");
    assert_eq!(plugin_default("env = \"TESSERA_METRICS_ADDR\""), ":9464");
    assert_eq!(env(&default, "TESSERA_METRICS_ADDR"), None);
    assert_eq!(env(&default, "RUST_LOG").as_deref(), Some("info"));
    assert_eq!(
        container(&default)["image"],
        "ghcr.io/tessera-gpu/tessera:0.1.0"
    );
    assert_eq!(volume_path(&default, "host-dev"), "/dev");
    // The driver root is found under the host's / (read-only, HostToContainer).
    assert_eq!(volume_path(&default, "host-root"), "/");
    assert!(a.contains(&"--host-root=/host-root".to_string()), "{a:?}");
    assert!(!a.iter().any(|a| a.starts_with("--driver-root")), "{a:?}");
    assert!(
        container(&default)["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "host-root"
                && m["readOnly"] == true
                && m["mountPropagation"] == "HostToContainer"),
        "{}",
        container(&default)["volumeMounts"]
    );
    assert_eq!(
        node_config(&default),
        // The built-in defaults, with device metadata files on (the shipped configs').
        NodeConfig::from_yaml(
            "apiVersion: config.tessera.dev/v1alpha1\nkind: NodeConfig\ndeviceMetadata: true\n",
            "defaults"
        )
        .unwrap()
    );
    let ds = get(&default, "DaemonSet", "tessera-plugin");
    assert_eq!(
        ds["spec"]["updateStrategy"]["rollingUpdate"],
        json!({"maxSurge": 1, "maxUnavailable": 0})
    );
    assert_eq!(pod_annotations(&default)["prometheus.io/port"], "9464");

    // Another namespace: the slice policy names the ServiceAccount there.
    let other = helm.template_ns("gpu-ops", &[]);
    let expr = get(
        &other,
        "ValidatingAdmissionPolicy",
        "tessera-resourceslices-own-node",
    )["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        expr,
        "request.userInfo.username == \"system:serviceaccount:gpu-ops:tessera-plugin\""
    );
    assert_eq!(
        get(&other, "ClusterRoleBinding", "tessera-plugin")["subjects"][0]["namespace"],
        "gpu-ops"
    );
    assert_eq!(
        get(&other, "DaemonSet", "tessera-plugin")["metadata"]["namespace"],
        "gpu-ops"
    );

    // Mock backend: the simulated node, its ConfigMap (the chart's copy of the
    // test-cluster overlay's) and the fake device and driver roots.
    let mock = helm.template(&["--set", "mock.enabled=true"]);
    let a = args(&mock);
    assert_eq!(a[0], "--backend=mock:/etc/tessera-mock/mock-node.yaml");
    assert!(
        a.contains(&"--host-dev-root=/var/lib/tessera-mock".to_string()),
        "{a:?}"
    );
    assert!(
        a.contains(&"--host-driver-root=/var/lib/tessera-mock/driver-root".to_string()),
        "{a:?}"
    );
    assert_eq!(volume_path(&mock, "host-dev"), "/var/lib/tessera-mock/dev");
    assert!(
        a.contains(&"--driver-root=/host-root/var/lib/tessera-mock/driver-root".to_string()),
        "{a:?}"
    );
    assert_eq!(volume_path(&mock, "host-root"), "/");
    assert_eq!(
        get(&mock, "ConfigMap", "tessera-mock-node")["data"]["mock-node.yaml"]
            .as_str()
            .unwrap(),
        std::fs::read_to_string(root().join("deploy/overlays/test-cluster/mock-node.yaml"))
            .unwrap()
    );
    assert!(pod_annotations(&mock).contains_key("checksum/mock-node"));
    assert!(!keys(&default).contains(&"ConfigMap/tessera-mock-node".to_string()));
    // ... and a node of one's own, as structured values.
    let own = helm.template(&[
        "--set-json",
        r#"mock.enabled=true,mock.node={"apiVersion":"mock.tessera.dev/v1alpha1","kind":"MockNode","gpus":[{"minor":0,"uuid":"GPU-00000000-0000-0000-0000-000000000001","productName":"Tesla T4"}]}"#,
    ]);
    let doc: Value = serde_yaml_ng::from_str(
        get(&own, "ConfigMap", "tessera-mock-node")["data"]["mock-node.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(doc["gpus"][0]["productName"], "Tesla T4");
    assert_ne!(
        pod_annotations(&own)["checksum/mock-node"],
        pod_annotations(&mock)["checksum/mock-node"]
    );

    // The test cluster: host network, the API server on loopback, metrics on loopback,
    // replace instead of surge.
    let tc = helm.template(&[
        "-f",
        root()
            .join("tests/data/helm/overlays__test-cluster.yaml")
            .to_str()
            .unwrap(),
    ]);
    let ds = get(&tc, "DaemonSet", "tessera-plugin");
    assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], true);
    assert_eq!(
        ds["spec"]["updateStrategy"]["rollingUpdate"],
        json!({"maxSurge": 0, "maxUnavailable": 1})
    );
    assert_eq!(
        env(&tc, "KUBERNETES_SERVICE_HOST").as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(
        env(&tc, "TESSERA_METRICS_ADDR").as_deref(),
        Some("127.0.0.1:9464")
    );
    assert_eq!(
        container(&tc)["readinessProbe"]["httpGet"]["host"],
        "127.0.0.1"
    );
    assert_eq!(container(&tc)["imagePullPolicy"], "Never");
    assert_eq!(container(&tc)["image"], "localhost/tessera/tessera:dev");

    // Watchdog modes.
    let report = helm.template(&["--set", "watchdog.mode=report,watchdog.tolerance=1Gi"]);
    let a = args(&report);
    assert!(a.contains(&"--watchdog=report".to_string()), "{a:?}");
    assert!(a.contains(&"--watchdog-tolerance=1Gi".to_string()), "{a:?}");
    let off = helm.template(&["--set", "watchdog.mode=off"]);
    let a = args(&off);
    assert!(a.contains(&"--watchdog=off".to_string()), "{a:?}");
    assert!(
        !a.iter().any(|a| a.starts_with("--watchdog-tolerance")),
        "{a:?}"
    );

    // Monitoring on: a PodMonitor selecting the plugin pods' metrics port, the dashboard.
    let mon = helm.template(&[
        "--set",
        "metrics.podMonitor.enabled=true,metrics.podMonitor.labels.release=prom,metrics.grafanaDashboard.enabled=true",
    ]);
    let pm = get(&mon, "PodMonitor", "tessera-plugin");
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pm["metadata"]["labels"]["release"], "prom");
    let ds = get(&mon, "DaemonSet", "tessera-plugin");
    assert_eq!(
        pm["spec"]["selector"]["matchLabels"],
        ds["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        pm["spec"]["podMetricsEndpoints"][0]["port"],
        container(&mon)["ports"][0]["name"]
    );
    assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["interval"], "30s");
    let dash = get(&mon, "ConfigMap", "tessera-grafana-dashboard");
    assert_eq!(dash["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dash["data"]["tessera-dashboard.json"].as_str().unwrap(),
        std::fs::read_to_string(root().join("deploy/monitoring/tessera-dashboard.json")).unwrap()
    );
    // Monitoring off: no scrape annotations, no PodMonitor; another port.
    let quiet = helm.template(&[
        "--set",
        "metrics.prometheusAnnotations=false,metrics.port=9500",
    ]);
    assert!(
        !pod_annotations(&quiet)
            .keys()
            .any(|k| k.starts_with("prometheus.io/"))
    );
    assert!(!keys(&quiet).iter().any(|k| k.starts_with("PodMonitor/")));
    assert_eq!(
        env(&quiet, "TESSERA_METRICS_ADDR").as_deref(),
        Some(":9500")
    );
    assert_eq!(container(&quiet)["ports"][0]["containerPort"], 9500);

    // DeviceClasses each on or off; extendedResourceName off.
    let none = helm.template(&["--set", "deviceClasses.gpu.enabled=false,deviceClasses.mig.enabled=false,deviceClasses.shared.enabled=false,deviceClasses.slot.enabled=false"]);
    assert!(
        !keys(&none).iter().any(|k| k.starts_with("DeviceClass/")),
        "{:?}",
        keys(&none)
    );
    let some = helm.template(&[
        "--set",
        "deviceClasses.mig.enabled=false,deviceClasses.gpu.extendedResourceName=",
    ]);
    let classes: Vec<String> = keys(&some)
        .into_iter()
        .filter(|k| k.starts_with("DeviceClass/"))
        .collect();
    assert_eq!(
        classes,
        [
            "DeviceClass/gpu.tessera.dev",
            "DeviceClass/shared.tessera.dev",
            "DeviceClass/slot.tessera.dev"
        ]
    );
    assert!(
        get(&some, "DeviceClass", "gpu.tessera.dev")["spec"]
            .get("extendedResourceName")
            .is_none()
    );
    assert_eq!(
        get(&default, "DeviceClass", "gpu.tessera.dev")["spec"]["extendedResourceName"],
        "nvidia.com/gpu"
    );

    // Admission policies off, one at a time.
    let vap = |objs: &[Value]| -> Vec<String> {
        keys(objs)
            .into_iter()
            .filter(|k| k.starts_with("ValidatingAdmission"))
            .collect()
    };
    assert_eq!(
        vap(&helm.template(&[
            "--set",
            "admissionPolicies.resourceSlicesOwnNode=false,admissionPolicies.gpuConfig=false,admissionPolicies.tenantPods=false"
        ])),
        Vec::<String>::new()
    );
    assert_eq!(
        vap(&helm.template(&["--set", "admissionPolicies.gpuConfig=false"])),
        [
            "ValidatingAdmissionPolicy/tessera-resourceslices-own-node",
            "ValidatingAdmissionPolicy/tessera-tenant-pods",
            "ValidatingAdmissionPolicyBinding/tessera-resourceslices-own-node",
            "ValidatingAdmissionPolicyBinding/tessera-tenant-pods"
        ]
    );
    assert_eq!(
        vap(&helm.template(&["--set", "admissionPolicies.tenantPods=false"])),
        [
            "ValidatingAdmissionPolicy/tessera-gpuconfig",
            "ValidatingAdmissionPolicy/tessera-resourceslices-own-node",
            "ValidatingAdmissionPolicyBinding/tessera-gpuconfig",
            "ValidatingAdmissionPolicyBinding/tessera-resourceslices-own-node"
        ]
    );

    // The node config as structured values: what the plugin's own decoder reads equals
    // the same config written by hand; a change changes the pods' checksum.
    let nc = helm.template(&[
        "-f",
        root()
            .join("tests/data/helm/node-config.yaml")
            .to_str()
            .unwrap(),
    ]);
    let want = NodeConfig::from_yaml(
        &std::fs::read_to_string(root().join("tests/data/helm/node-config.expected.yaml")).unwrap(),
        "tests/data/helm/node-config.expected.yaml",
    )
    .unwrap();
    assert_eq!(node_config(&nc), want);
    assert_ne!(
        pod_annotations(&nc)["checksum/node-config"],
        pod_annotations(&default)["checksum/node-config"]
    );

    // Paths of another distribution's kubelet; image, log level, extra args and env.
    let k0s = helm.template(&[
        "--set",
        "hostPaths.kubeletRootDir=/var/lib/k0s/kubelet,hostPaths.driverRoot=/run/nvidia/driver,hostPaths.runDir=/run/t",
        "--set",
        "image.tag=0.2.0,image.pullPolicy=Always,logLevel=info\\,tessera::watchdog=debug,priorityClassName=",
        "--set-json",
        r#"extraArgs=["--adopt-unknown-mig"],extraEnv=[{"name":"X","value":"y"}]"#,
    ]);
    let a = args(&k0s);
    assert!(
        a.contains(&"--plugin-dir=/var/lib/k0s/kubelet/plugins/gpu.tessera.dev".to_string()),
        "{a:?}"
    );
    assert!(
        a.contains(&"--host-driver-root=/run/nvidia/driver".to_string()),
        "{a:?}"
    );
    assert!(a.contains(&"--host-run-dir=/run/t".to_string()), "{a:?}");
    assert_eq!(a.last().unwrap(), "--adopt-unknown-mig");
    assert_eq!(
        volume_path(&k0s, "plugins-registry"),
        "/var/lib/k0s/kubelet/plugins_registry"
    );
    assert_eq!(volume_path(&k0s, "plugins"), "/var/lib/k0s/kubelet/plugins");
    assert!(
        a.contains(&"--driver-root=/host-root/run/nvidia/driver".to_string()),
        "{a:?}"
    );
    assert!(
        container(&k0s)["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == "/var/lib/k0s/kubelet/plugins")
    );
    assert_eq!(
        container(&k0s)["image"],
        "ghcr.io/tessera-gpu/tessera:0.2.0"
    );
    assert_eq!(container(&k0s)["imagePullPolicy"], "Always");
    assert_eq!(
        env(&k0s, "RUST_LOG").as_deref(),
        Some("info,tessera::watchdog=debug")
    );
    assert_eq!(env(&k0s, "X").as_deref(), Some("y"));
    assert!(
        get(&k0s, "DaemonSet", "tessera-plugin")["spec"]["template"]["spec"]
            .get("priorityClassName")
            .is_none()
    );

    // namespace.create: the Namespace, privileged for Pod Security.
    let ns = helm.template(&["--set", "namespace.create=true"]);
    assert_eq!(
        get(&ns, "Namespace", "tessera-system")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
}

#[test]
fn the_schema_refuses_unknown_keys_and_bad_values() {
    let Some(helm) = helm() else { return };
    let chart = chart();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--set", "replicas=2"],
            &["at '': additional properties 'replicas' not allowed"],
        ),
        (
            &["--set", "watchdog.tolerence=1Gi"],
            &["at '/watchdog': additional properties 'tolerence' not allowed"],
        ),
        (
            &["--set", "nodeConfig.mode=shared"],
            &["at '/nodeConfig': additional properties 'mode' not allowed"],
        ),
        (
            &["--set", "watchdog.mode=kill"],
            &["at '/watchdog/mode': value must be one of 'enforce', 'report', 'off'"],
        ),
        (
            &["--set", "nodeConfig.sharedSlots=3"],
            &["at '/nodeConfig/sharedSlots': value must be one of 1, 2, 4, 5, 10, 20, 25, 50, 100"],
        ),
        (
            &["--set", "nodeConfig.defaultMode=whole"],
            &[
                "at '/nodeConfig/defaultMode': value must be one of '', 'exclusive', 'mig', 'shared'",
            ],
        ),
        (
            &["--set", "metrics.port=70000"],
            &["at '/metrics/port': maximum: got 70,000, want 65,535"],
        ),
        (
            &["--set", "image.pullPolicy=Sometimes"],
            &["at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'"],
        ),
        (
            &["--set", "hostPaths.stateDir=var/lib/tessera"],
            &["at '/hostPaths/stateDir': 'var/lib/tessera' does not match pattern '^/'"],
        ),
        (
            &["--set", "logLevel=loud"],
            &["at '/logLevel': 'loud' does not match pattern"],
        ),
        (
            &["--set", "watchdog.tolerance=lots"],
            &["at '/watchdog/tolerance': 'lots' does not match pattern"],
        ),
        (
            &["--set", "mock.enabled=yes"],
            &["at '/mock/enabled': got string, want boolean"],
        ),
        (
            &[
                "--set-json",
                r#"nodeConfig.gpus=[{"match":{"minor":0,"uuid":"GPU-1"},"mode":"mig"}]"#,
            ],
            &["at '/nodeConfig/gpus/0/match': maxProperties: got 2, want 1"],
        ),
        (
            &[
                "--set-json",
                r#"nodeConfig.gpus=[{"match":{"minor":0},"mode":"whole"}]"#,
            ],
            &["at '/nodeConfig/gpus/0/mode': value must be one of 'exclusive', 'mig', 'shared'"],
        ),
        (
            &["--set-json", r#"nodeConfig.health={"gpuLost":"Reboot"}"#],
            &[
                "at '/nodeConfig/health/gpuLost': value must be one of 'Ignore', 'NoSchedule', 'NoExecute'",
            ],
        ),
    ];
    for (args, want) in cases {
        for cmd in ["template", "lint"] {
            let mut all = vec![cmd];
            if cmd == "template" {
                all.push("tessera");
            }
            all.push(chart.to_str().unwrap());
            all.extend_from_slice(args);
            let r = helm.run(&all);
            assert!(!r.ok, "helm {} was accepted", all.join(" "));
            let msg = format!("{}{}", r.stdout, r.stderr);
            assert!(
                msg.contains("values don't meet the specifications of the schema(s)"),
                "helm {}: {msg}",
                all.join(" ")
            );
            for w in *want {
                assert!(
                    msg.contains(w),
                    "helm {}: want {w:?} in:\n{msg}",
                    all.join(" ")
                );
            }
        }
    }
    eprintln!("schema: {} bad values refused, each named", cases.len());
}

/// The chart's copies of deploy/'s files equal their sources (deploy/helm/sync.sh).
#[test]
fn the_charts_copies_equal_their_sources() {
    let d = root().join("deploy");
    let f = chart().join("files");
    let mut pairs = vec![
        (
            d.join("base/admission-resourceslices.yaml"),
            f.join("admission-resourceslices.yaml"),
        ),
        (
            d.join("base/admission-gpuconfig.yaml"),
            f.join("admission-gpuconfig.yaml"),
        ),
        (
            d.join("base/admission-tenant-pods.yaml"),
            f.join("admission-tenant-pods.yaml"),
        ),
        (
            d.join("overlays/k8s-1.34/admission-shares.yaml"),
            f.join("admission-shares.yaml"),
        ),
        (
            d.join("monitoring/tessera-dashboard.json"),
            f.join("tessera-dashboard.json"),
        ),
        (
            d.join("overlays/test-cluster/mock-node.yaml"),
            f.join("mock-node.yaml"),
        ),
    ];
    let mut classes: Vec<PathBuf> = std::fs::read_dir(d.join("deviceclasses"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_str().unwrap().ends_with(".tessera.dev.yaml"))
        .collect();
    classes.sort();
    assert_eq!(classes.len(), 4);
    let copies = std::fs::read_dir(f.join("deviceclasses")).unwrap().count();
    assert_eq!(
        copies,
        classes.len(),
        "files/deviceclasses: run deploy/helm/sync.sh"
    );
    for c in classes {
        let name = c.file_name().unwrap().to_owned();
        pairs.push((c, f.join("deviceclasses").join(name)));
    }
    for (src, copy) in pairs {
        assert_eq!(
            std::fs::read(&copy).unwrap_or_default(),
            std::fs::read(&src).unwrap(),
            "{} differs from {}: run deploy/helm/sync.sh",
            copy.display(),
            src.display()
        );
    }
}

// ---------- parity with kustomize ----------

fn kubectl() -> Option<PathBuf> {
    let ok = |p: &Path| {
        Command::new(p)
            .args(["version", "--client"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if ok(Path::new("kubectl")) {
        return Some("kubectl".into());
    }
    let mut built: Vec<PathBuf> = std::fs::read_dir(root().join("target/k8s"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("kubectl"))
        .collect();
    built.sort();
    built.into_iter().rev().find(|p| ok(p))
}

fn kustomize(kubectl: &Path, dir: &Path) -> Vec<Value> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    schedule::documents(&String::from_utf8_lossy(&out.stdout), "kustomize").unwrap()
}

/// The labels the chart adds to every object (Helm's conventions).
const HELM_LABELS: &[&str] = &[
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/part-of",
];

const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// kustomize's configMapGenerator names: NAME-<10 character content hash>.
fn unhash(name: &str) -> String {
    for generated in ["tessera-node-config", "tessera-mock-node"] {
        if let Some(rest) = name
            .strip_prefix(generated)
            .and_then(|r| r.strip_prefix('-'))
            && rest.len() == 10
            && rest.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return generated.to_string();
        }
    }
    name.to_string()
}

/// The documented differences between the chart's objects and kustomize's, removed.
fn normalise(mut o: Value) -> Value {
    // (`get_mut`: indexing a map mutably inserts a null for a missing key.)
    let meta = o["metadata"].as_object_mut().unwrap();
    if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
        for l in HELM_LABELS {
            labels.remove(*l);
        }
        if labels.is_empty() {
            meta.remove("labels");
        }
    }
    if o["kind"] == "ConfigMap" {
        let name = unhash(o["metadata"]["name"].as_str().unwrap());
        o["metadata"]["name"] = json!(name);
        // The node config is compared as the plugin reads it (comments and defaults aside).
        if let Some(text) = o["data"]["node-config.yaml"].as_str() {
            let cfg = NodeConfig::from_yaml(text, &name).unwrap();
            o["data"]["node-config.yaml"] = serde_json::to_value(cfg).unwrap();
        }
    }
    // kubectl's kustomize does not know DeviceClasses and the admission policies to be
    // cluster-scoped and gives them its namespace (the API server ignores it).
    if CLUSTER_SCOPED.contains(&o["kind"].as_str().unwrap()) {
        o["metadata"].as_object_mut().unwrap().remove("namespace");
    }
    if o["kind"] == "DaemonSet" {
        let t = &mut o["spec"]["template"];
        if let Some(a) = t["metadata"]
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
        {
            a.retain(|k, _| !k.starts_with("checksum/"));
        }
        // The order of the lists merged by name: kustomize's strategic merge puts a
        // patch's new entries first, the chart appends them (no env refers to another).
        let by_name = |l: &mut Value| {
            if let Some(l) = l.as_array_mut() {
                l.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            }
        };
        if let Some(v) = t["spec"].get_mut("volumes") {
            by_name(v);
        }
        for c in t["spec"]["containers"].as_array_mut().unwrap() {
            for list in ["env", "volumeMounts"] {
                if let Some(l) = c.get_mut(list) {
                    by_name(l);
                }
            }
        }
        for v in t["spec"]["volumes"].as_array_mut().unwrap() {
            if let Some(n) = v["configMap"]["name"].as_str() {
                v["configMap"]["name"] = json!(unhash(n));
            }
        }
    }
    o
}

fn by_key(objs: Vec<Value>) -> BTreeMap<String, Value> {
    objs.into_iter()
        .map(normalise)
        .map(|o| (key(&o), o))
        .collect()
}

/// deploy/base, each overlay and deploy/monitoring against the chart with the values of
/// tests/data/helm/<dir>.yaml.
#[test]
fn the_chart_renders_what_kustomize_renders() {
    let Some(helm) = helm() else { return };
    let Some(kubectl) = kubectl() else {
        skip("kubectl is missing (PATH or target/k8s/*/kubectl)");
        return;
    };
    let mut dirs = vec!["base".to_string(), "monitoring".to_string()];
    let mut overlays: Vec<String> = std::fs::read_dir(root().join("deploy/overlays"))
        .unwrap()
        .flatten()
        .map(|e| format!("overlays/{}", e.file_name().to_str().unwrap()))
        .collect();
    overlays.sort();
    dirs.extend(overlays);
    let mut compared = 0;
    for dir in dirs {
        let values = root()
            .join("tests/data/helm")
            .join(format!("{}.yaml", dir.replace('/', "__")));
        assert!(
            values.is_file(),
            "deploy/{dir} has no chart values to compare with ({}): add them",
            values.display()
        );
        let kust = by_key(kustomize(&kubectl, &root().join("deploy").join(&dir)));
        let mut chart = by_key(helm.template(&["-f", values.to_str().unwrap()]));
        if dir == "monitoring" {
            // A kustomization of one object, applied beside a base.
            chart.retain(|k, _| kust.contains_key(k));
        }
        assert_eq!(
            chart.keys().collect::<Vec<_>>(),
            kust.keys().collect::<Vec<_>>(),
            "deploy/{dir}: the chart's objects (left) and kustomize's (right)"
        );
        for (k, want) in &kust {
            let got = &chart[k];
            if got != want {
                panic!(
                    "deploy/{dir}: {k} differs from the chart's (values {}):\nkustomize: {}\nhelm:      {}",
                    values.display(),
                    serde_json::to_string_pretty(want).unwrap(),
                    serde_json::to_string_pretty(got).unwrap()
                );
            }
            compared += 1;
        }
        eprintln!("deploy/{dir}: {} objects equal", kust.len());
    }
    assert!(compared > 5 * 14, "{compared} objects compared");
}
