//! docs/design.md documents the `region` and `control` layouts as tables; this test
//! reads those tables and checks every offset and size against the code, so the
//! document cannot drift from the ABI.

use tessera_abi::{control, region};

/// Rows `| offset | size | field |` of the table under `heading`.
fn table(doc: &str, heading: &str) -> Vec<(String, usize, String)> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("docs/design.md has no {heading:?}"));
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            (
                cols[1].to_string(),
                cols[2].parse().unwrap_or_else(|_| panic!("size in {l:?}")),
                cols[3].to_string(),
            )
        })
        .collect()
}

fn doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/design.md"))
        .expect("docs/design.md in the workspace")
}

#[test]
fn region_table_matches_the_code() {
    let rows = table(&doc(), "### `region` v3");
    let want: Vec<(&str, usize, usize)> = vec![
        ("", region::hdr::MAGIC, 8),
        ("", region::hdr::VERSION, 4),
        ("", region::hdr::HEADER_SIZE, 4),
        ("", region::hdr::FILE_SIZE, 8),
        ("", region::hdr::GPU_COUNT, 4),
        ("", region::hdr::GPU_ENTRY_SIZE, 4),
        ("", region::hdr::GPU_TABLE, 4),
        ("", region::hdr::SLOT_COUNT, 4),
        ("", region::hdr::SLOT_SIZE, 4),
        ("", region::hdr::SLOT_TABLE, 4),
        ("", region::hdr::SLOT_MAP, 4),
        ("GPU entry + ", region::gpu::UUID, tessera_abi::UUID_FIELD),
        ("GPU entry + ", region::gpu::USED, 8),
        ("GPU entry + ", region::gpu::PEAK, 8),
        ("GPU entry + ", region::gpu::REFUSED, 8),
        ("GPU entry + ", region::gpu::TAT, 8),
        ("GPU entry + ", region::gpu::BLOCKS, 8),
        ("GPU entry + ", region::gpu::LAUNCHES, 8),
        ("GPU entry + ", region::gpu::WAITED_NS, 8),
        ("GPU entry + ", region::gpu::CONTEXT_BYTES, 8),
        ("slot + ", region::slot::TOKEN, 16),
        ("slot + ", region::slot::FLAGS, 4),
        ("slot + ", region::slot::STARTED_NS, 8),
        ("slot + ", region::slot::CHARGED, 8),
        ("slot + ", region::slot::pooled(0, 0), 8),
    ];
    assert_eq!(rows.len(), want.len(), "{rows:#?}");
    for ((off, size, field), (prefix, o, s)) in rows.iter().zip(&want) {
        let n = off
            .strip_prefix(prefix)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|r| r.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("offset {off:?} of {field:?}"));
        assert_eq!((n, *size), (*o, *s), "{field}");
    }
    // Values the table states in words.
    let l = region::Layout::current(2, region::DEFAULT_SLOTS).unwrap();
    assert!(rows[1].2.contains(&format!("({};", region::VERSION)));
    assert!(
        rows.last().unwrap().0.contains("+ 8·GPUs + 8·g"),
        "the pool counters follow the charged ones"
    );
    assert_eq!(
        region::slot::pooled(2, 1),
        region::slot::CHARGED + 8 * 2 + 8
    );
    assert!(rows[2].2.contains(&format!("({})", region::HEADER_SIZE)));
    assert!(rows[5].2.contains(&format!("({})", region::GPU_ENTRY_SIZE)));
    assert!(rows[7].2.contains(&format!("({})", region::DEFAULT_SLOTS)));
    assert_eq!(l.slot_size, 128, "64 + 16·2 rounded up to 64");
    assert!(rows[8].2.contains("64 + 16·GPUs"));
    assert_eq!(
        l.slot_map,
        l.slot_table + l.slot_count * l.slot_size,
        "the slot map follows the slot table"
    );
    assert!(rows[10].2.contains("after the slot table"));
    assert!(rows[0].2.contains("TSRAREG"));
}

#[test]
fn control_table_matches_the_code() {
    let rows = table(&doc(), "### `control` v1");
    let head: Vec<(usize, usize)> = vec![
        (control::hdr::MAGIC, 8),
        (control::hdr::VERSION, 4),
        (control::hdr::HEADER_SIZE, 4),
        (control::hdr::FILE_SIZE, 8),
        (control::hdr::GPU_COUNT, 4),
        (control::hdr::ENTRY_SIZE, 4),
        (control::hdr::SEQ, 8),
    ];
    let entry: Vec<(usize, usize)> = vec![
        (control::entry::UUID, tessera_abi::UUID_FIELD),
        (control::entry::SHARE, 4),
        (control::entry::LIMIT, 4),
        (control::entry::BLOCK_RATE, 8),
        (control::entry::UPDATES, 8),
        (control::entry::BURST_NS, 8),
    ];
    assert_eq!(rows.len(), head.len() + entry.len(), "{rows:#?}");
    for ((off, size, field), (o, s)) in rows.iter().zip(&head) {
        assert_eq!((off.parse::<usize>().unwrap(), *size), (*o, *s), "{field}");
    }
    for ((off, size, field), (o, s)) in rows[head.len()..].iter().zip(&entry) {
        let n: usize = off
            .rsplit("+ ")
            .next()
            .and_then(|r| r.trim().parse().ok())
            .unwrap_or_else(|| panic!("offset {off:?}"));
        assert_eq!((n, *size), (*o, *s), "{field}");
    }
    assert!(rows[0].2.contains("TSRACTL"));
    assert!(
        rows[head.len()]
            .0
            .starts_with(&format!("{} + 128", control::HEADER_SIZE))
    );
}
