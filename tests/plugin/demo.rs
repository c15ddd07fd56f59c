//! `tessera-demo` end to end: the claim table is a contract.

use testkit::harness;

/// The whole-GPU phase gives w1 gpu-0 and w2 gpu-2 + gpu-3; the MIG phase packs three
/// 1g.10gb from the end of gpu-0 and a 3g.40gb at its start, creating and destroying the
/// instances; one spec per claim, and nothing left after unprepare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_allocates_the_contract_table_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut out = String::new();
    let lib = harness::interception_stand_in(dir.path());
    let report = testkit::demo::run(&dir.path().join("demo"), &lib, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{out}"));
    let table: Vec<(String, Vec<String>)> = report
        .prepared
        .iter()
        .map(|(n, d, _, _)| (n.clone(), d.clone()))
        .collect();
    let want: Vec<(&str, Vec<&str>)> = vec![
        ("w1", vec!["gpu-0"]),
        ("w2", vec!["gpu-2", "gpu-3"]),
        ("m1", vec!["gpu-0-mig-1g10gb-19-6"]),
        ("m2", vec!["gpu-0-mig-1g10gb-19-5"]),
        ("m3", vec!["gpu-0-mig-1g10gb-19-4"]),
        ("m4", vec!["gpu-0-mig-3g40gb-9-0"]),
        ("s1", vec!["gpu-1"]),
        ("s2", vec!["gpu-1"]),
    ];
    let want: Vec<(String, Vec<String>)> = want
        .into_iter()
        .map(|(n, d)| (n.to_string(), d.into_iter().map(String::from).collect()))
        .collect();
    assert_eq!(table, want);
    for (name, devices, ids, spec) in &report.prepared {
        assert_eq!(ids.len(), devices.len(), "{name}");
        assert!(
            ids.iter().all(|id| id.starts_with("tessera.dev/gpu=")),
            "{ids:?}"
        );
        assert!(!spec.exists(), "{name}: spec removed by unprepare");
    }
    assert!(
        report.leftover_files.is_empty(),
        "{:?}",
        report.leftover_files
    );
    assert_eq!(report.mig_left, 0, "unprepare destroyed every MIG device");
    // The shared claims' budgets come from consumedCapacity: 20 GiB and 30 GiB of gpu-1.
    let budgets: Vec<(String, u64)> = report
        .shared_limits
        .iter()
        .map(|(n, text)| {
            let l = tessera_abi::limits::Limits::parse(text).unwrap();
            assert_eq!(l.gpus.len(), 1, "{n}");
            (n.clone(), l.gpus[0].memory_bytes)
        })
        .collect();
    assert_eq!(
        budgets,
        [
            ("s1".to_string(), 20u64 << 30),
            ("s2".to_string(), 30u64 << 30)
        ]
    );
    assert!(out.contains("25 % compute reserved"), "{out}");
    assert!(out.contains("40 % compute reserved"), "{out}");
    assert!(
        report.leftover_claim_dirs.is_empty(),
        "{:?}",
        report.leftover_claim_dirs
    );
    assert!(out.contains("MIG mode on, 4 MIG device(s)"), "{out}");
    assert!(out.contains("MIG mode off, 0 MIG device(s) left"), "{out}");
}
