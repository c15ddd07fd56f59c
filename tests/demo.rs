//! `tessera demo` end to end: the claim table is a contract.

/// The whole-GPU phase gives w1 gpu-0 and w2 gpu-2 + gpu-3, writes one spec per claim,
/// and leaves no file after unprepare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_allocates_the_contract_table_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut out = String::new();
    let report = tessera::demo::run(dir.path(), &mut out)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{out}"));
    let table: Vec<(String, Vec<String>)> = report
        .prepared
        .iter()
        .map(|(n, d, _, _)| (n.clone(), d.clone()))
        .collect();
    assert_eq!(
        table,
        [
            ("w1".to_string(), vec!["gpu-0".to_string()]),
            (
                "w2".to_string(),
                vec!["gpu-2".to_string(), "gpu-3".to_string()]
            ),
        ]
    );
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
    assert!(out.contains("phase: whole GPUs"), "{out}");
}
