//! The allocator model's rules, one test each, on small pools built here. The plugin's
//! `tests/model/plan_allocator.rs` already covers first fit and release, a request selector,
//! backtracking inside one request, a distinct pair, the firstAvailable fallback, `All`
//! failing once a device is taken, overlapping partitions, stepped capacity rounding
//! and three invalid pools; these specify the rest.

use k8s_model::allocator::{AllocError, Allocator};
use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};
use serde_json::{Value, json};

const D: &str = "gpu.tessera.dev";

/// A device with string attributes in the driver's domain; `type` is `gpu` unless set.
fn dev(name: &str, attrs: &[(&str, &str)]) -> Value {
    let mut a = json!({"type": {"string": "gpu"}});
    for (k, v) in attrs {
        a[*k] = json!({"string": v});
    }
    json!({"name": name, "attributes": a})
}

/// `base` with the fields of `extra` added (a device with counters or capacity).
fn with(mut base: Value, extra: Value) -> Value {
    base.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    base
}

/// `consumesCounters` of one set: each named counter, with its quantity.
fn consumes(set: &str, counters: &[(&str, &str)]) -> Value {
    let c: serde_json::Map<String, Value> = counters
        .iter()
        .map(|(k, v)| (k.to_string(), json!({"value": v})))
        .collect();
    json!({"consumesCounters": [{"counterSet": set, "counters": c}]})
}

/// A `sharedCounters` slice part holding one counter set.
fn counter_set(set: &str, counters: &[(&str, &str)]) -> Value {
    let c = &consumes(set, counters)["consumesCounters"][0]["counters"];
    json!({"sharedCounters": [{"name": set, "counters": c}]})
}

/// A `devices` slice part.
fn devices(d: Vec<Value>) -> Value {
    json!({"devices": d})
}

/// The slices of one node's pool (named after the node), generation 1, one per part.
fn pool(node: &str, parts: Vec<Value>) -> Vec<ResourceSlice> {
    let n = parts.len();
    let parts = parts.into_iter().enumerate();
    parts
        .map(|(i, part)| {
            let mut spec = json!({"driver": D, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": n}});
            spec.as_object_mut()
                .unwrap()
                .extend(part.as_object().unwrap().clone());
            serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice", "metadata": {"name": format!("{node}-{i}")},
                "spec": spec}))
            .unwrap()
        })
        .collect()
}

/// `device.attributes[D].<name> == "<value>"`.
fn is(name: &str, value: &str) -> String {
    format!(r#"device.attributes["{D}"].{name} == "{value}""#)
}

/// Classes by device type (`gpu`, `mig`, `shared`); `gpu-m1` has two selectors;
/// `configured` carries an opaque config.
fn classes() -> Vec<DeviceClass> {
    let of_driver = format!(r#"device.driver == "{D}""#);
    let class = |name: &str, sels: &[String], config: Value| -> DeviceClass {
        let sels: Vec<Value> = sels
            .iter()
            .map(|e| json!({"cel": {"expression": e}}))
            .collect();
        serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": sels, "config": config}}))
        .unwrap()
    };
    let opaque = json!([{"opaque": {"driver": D, "parameters": {"from": "class"}}}]);
    vec![
        class("gpu", &[of_driver.clone(), is("type", "gpu")], json!([])),
        class("mig", &[of_driver.clone(), is("type", "mig")], json!([])),
        class("shared", &[of_driver, is("type", "gpu-shared")], json!([])),
        class("gpu-m1", &[is("type", "gpu"), is("model", "m1")], json!([])),
        class("configured", &[is("type", "gpu")], opaque),
    ]
}

fn gates() -> FeatureGates {
    FeatureGates::defaults(KubeVersion::NEWEST)
}

fn allocator(slices: &[ResourceSlice]) -> Allocator {
    let a = Allocator::new(slices, &classes(), &gates()).unwrap();
    assert_eq!(a.skipped_pools(), []);
    a
}

/// An `exactly` request of `count` devices (absent when 0) with CEL selectors.
fn req(name: &str, class: &str, count: i64, sels: &[String]) -> Value {
    let sels: Vec<Value> = sels
        .iter()
        .map(|e| json!({"cel": {"expression": e}}))
        .collect();
    let mut e = json!({"deviceClassName": class, "selectors": sels});
    if count > 0 {
        e["count"] = json!(count);
    }
    json!({"name": name, "exactly": e})
}

/// An `exactly` request of one device asking for capacities (`memory: 20Gi`, ...).
fn cap_req(name: &str, class: &str, caps: &[(&str, &str)]) -> Value {
    let mut r = req(name, class, 1, &[]);
    let caps: serde_json::Map<String, Value> = caps
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    r["exactly"]["capacity"] = json!({"requests": caps});
    r
}

/// A claim in namespace `default` with `spec.devices` = `devices`.
fn claim(name: &str, devices: Value) -> ResourceClaim {
    serde_json::from_value(
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"}, "spec": {"devices": devices}}),
    )
    .unwrap()
}

/// A claim of the given requests, without constraints.
fn claim_of(name: &str, requests: Vec<Value>) -> ResourceClaim {
    claim(name, json!({ "requests": requests }))
}

fn results(r: &AllocationResult) -> &[DeviceRequestAllocationResult] {
    r.devices.as_ref().unwrap().results.as_deref().unwrap()
}

/// `request=device` per allocated device, in result order.
fn picked(r: &AllocationResult) -> Vec<String> {
    results(r)
        .iter()
        .map(|x| format!("{}={}", x.request, x.device))
        .collect()
}

/// The node the allocation is pinned to.
fn node_of(r: &AllocationResult) -> String {
    let term = &r.node_selector.as_ref().unwrap().node_selector_terms[0];
    term.match_fields.as_ref().unwrap()[0]
        .values
        .as_ref()
        .unwrap()[0]
        .clone()
}

/// The unsatisfiable reason, or a panic naming what was allocated instead.
fn unsatisfiable(r: Result<AllocationResult, AllocError>) -> String {
    match r {
        Err(AllocError::Unsatisfiable(why)) => why,
        Err(e) => panic!("expected Unsatisfiable, got {e:?}"),
        Ok(r) => panic!("expected a failure, got {:?}", picked(&r)),
    }
}

fn gpus(n: usize) -> Vec<Value> {
    (0..n).map(|i| dev(&format!("g{i}"), &[])).collect()
}

/// `exactly` takes `count` devices (one when `count` is absent), the first free ones in
/// slice order, and no more than that.
#[test]
fn exact_count_takes_that_many_devices_in_order() {
    let mut a = allocator(&pool("n", vec![devices(gpus(5))]));
    let three = a.allocate(&claim_of("three", vec![req("r", "gpu", 3, &[])]));
    assert_eq!(picked(&three.unwrap()), ["r=g0", "r=g1", "r=g2"]);
    let default = a.allocate(&claim_of("one", vec![req("r", "gpu", 0, &[])]));
    assert_eq!(picked(&default.unwrap()), ["r=g3"]);
}

/// A device that is not multi-allocatable goes to one request only: two requests of
/// one claim never get the same device.
#[test]
fn two_requests_of_a_claim_never_share_a_plain_device() {
    let two = || claim_of("c", vec![req("a", "gpu", 1, &[]), req("b", "gpu", 1, &[])]);
    let mut one_gpu = allocator(&pool("n", vec![devices(gpus(1))]));
    let why = unsatisfiable(one_gpu.allocate(&two()));
    assert!(why.contains("cannot be satisfied together"), "{why}");
    let mut two_gpus = allocator(&pool("n", vec![devices(gpus(2))]));
    assert_eq!(
        picked(&two_gpus.allocate(&two()).unwrap()),
        ["a=g0", "b=g1"]
    );
}

/// All of a claim's devices come from one node, tried in order of first appearance:
/// two devices split over two nodes do not make a count of 2.
#[test]
fn a_claim_takes_all_its_devices_from_one_node() {
    let mut slices = pool("node-a", vec![devices(vec![dev("a0", &[])])]);
    slices.extend(pool(
        "node-b",
        vec![devices(vec![dev("b0", &[]), dev("b1", &[])])],
    ));
    let mut a = allocator(&slices);
    let r = a
        .allocate(&claim_of("two", vec![req("r", "gpu", 2, &[])]))
        .unwrap();
    assert_eq!(
        (picked(&r), node_of(&r)),
        (vec!["r=b0".into(), "r=b1".into()], "node-b".into())
    );
    let r = a.allocate(&claim_of("one", vec![req("r", "gpu", 1, &[])]));
    assert_eq!(node_of(&r.unwrap()), "node-a");
    let why = unsatisfiable(a.allocate(&claim_of("more", vec![req("r", "gpu", 1, &[])])));
    assert!(
        why.contains("3 device(s) match, 0 available, 1 needed"),
        "{why}"
    );
}

/// `allocationMode: All` takes every matching device of one node (not of the cluster);
/// when one of them is taken there, the next node is tried.
#[test]
fn all_mode_takes_every_matching_device_of_one_node() {
    let fast = |n: &str| dev(n, &[("tier", "fast")]);
    let mut slices = pool(
        "node-a",
        vec![devices(vec![
            fast("a0"),
            dev("a1", &[("tier", "slow")]),
            fast("a2"),
        ])],
    );
    slices.extend(pool("node-b", vec![devices(vec![fast("b0")])]));
    let mut a = allocator(&slices);
    let all_fast = |name: &str| {
        let mut r = req("r", "gpu", 0, &[is("tier", "fast")]);
        r["exactly"]["allocationMode"] = json!("All");
        // A second request shows the devices All took are taken for the claim too.
        claim_of(name, vec![r, req("any", "gpu", 1, &[])])
    };
    let r = a.allocate(&all_fast("first")).unwrap();
    assert_eq!(picked(&r), ["r=a0", "r=a2", "any=a1"]);
    assert_eq!(node_of(&r), "node-a");
    let r = a.allocate(&all_fast("second"));
    let why = unsatisfiable(r);
    // node-b has its fast device but nothing for `any`.
    assert!(
        why.contains(r#"request "r" (class gpu): 3 device(s) match, 1 available, all needed"#),
        "{why}"
    );
    a.release("default", "first");
    let mut r = req("r", "gpu", 0, &[is("tier", "fast")]);
    r["exactly"]["allocationMode"] = json!("All");
    let b = a.allocate(&claim_of("again", vec![r.clone()]));
    assert_eq!(picked(&b.unwrap()), ["r=a0", "r=a2"]);
    let next = a.allocate(&claim_of("next", vec![r])).unwrap();
    assert_eq!(
        (picked(&next), node_of(&next)),
        (vec!["r=b0".into()], "node-b".into())
    );
}

/// `allocationMode: All` needs at least one matching device: matching none is a
/// failure, not an empty allocation.
#[test]
fn all_mode_fails_without_any_matching_device() {
    let slow = vec![dev("g0", &[("tier", "slow")])];
    let mut a = allocator(&pool("n", vec![devices(slow)]));
    let mut r = req("r", "gpu", 0, &[is("tier", "fast")]);
    r["exactly"]["allocationMode"] = json!("All");
    let why = unsatisfiable(a.allocate(&claim_of("none", vec![r])));
    assert!(
        why.contains("0 device(s) match, 0 available, all needed"),
        "{why}"
    );
}

/// A `firstAvailable` request takes the first subrequest, in listed order, with which
/// the whole claim fits: a later request that needs the device the first subrequest
/// took sends the search back to the next subrequest.
#[test]
fn first_available_takes_the_first_subrequest_the_whole_claim_fits_with() {
    let mut a = allocator(&pool(
        "n",
        vec![devices(vec![
            dev("big", &[("model", "big")]),
            dev("small", &[("model", "small")]),
        ])],
    ));
    let sub = |n: &str| {
        json!({"name": n, "deviceClassName": "gpu",
        "selectors": [{"cel": {"expression": is("model", n)}}]})
    };
    let flexible = json!({"name": "a", "firstAvailable": [sub("big"), sub("small")]});
    // Alone, the first subrequest wins although the second fits as well.
    let alone = a.allocate(&claim_of("alone", vec![flexible.clone()]));
    assert_eq!(picked(&alone.unwrap()), ["a/big=big"]);
    a.release("default", "alone");
    let with_b = claim_of(
        "pair",
        vec![flexible, req("b", "gpu", 1, &[is("model", "big")])],
    );
    assert_eq!(
        picked(&a.allocate(&with_b).unwrap()),
        ["a/small=small", "b=big"]
    );
}

/// Three nodes in slice order: `node-a` has only a whole GPU, `node-b` and `node-c` a
/// whole GPU and a MIG device each.
fn a_gpu_node_then_two_mig_nodes() -> Vec<ResourceSlice> {
    let mut slices = pool("node-a", vec![devices(vec![dev("a-gpu", &[])])]);
    for n in ["b", "c"] {
        let mig = dev(&format!("{n}-mig"), &[("type", "mig")]);
        slices.extend(pool(
            &format!("node-{n}"),
            vec![devices(vec![mig, dev(&format!("{n}-gpu"), &[])])],
        ));
    }
    slices
}

/// `firstAvailable` of a MIG device, else a whole GPU.
fn mig_else_gpu(name: &str) -> ResourceClaim {
    let sub = |n: &str, class: &str| json!({"name": n, "deviceClassName": class});
    let r = json!({"name": "r", "firstAvailable": [sub("mig", "mig"), sub("gpu", "gpu")]});
    claim_of(name, vec![r])
}

/// The node and `request=device` of an allocation.
fn placed(r: Result<AllocationResult, AllocError>) -> (String, Vec<String>) {
    let r = r.unwrap();
    (node_of(&r), picked(&r))
}

/// From 1.35 the scheduler scores nodes by the `firstAvailable` subrequests their
/// allocation uses (DynamicResources `computeScore`: 8 minus the subrequest's index),
/// so a claim goes where its first alternative fits even when an earlier node fits only
/// a later one; among equal scores plan takes the first node in order. With no node
/// left for the first alternative, the first node where a later one fits wins; a claim
/// without `firstAvailable` still takes the first node where it fits. (The 1.37.2
/// scheduler at 1,000 nodes gave every such claim its first alternative; docs/scale.md.)
#[test]
fn first_available_prefers_the_node_where_an_earlier_subrequest_fits() {
    let mut a = allocator(&a_gpu_node_then_two_mig_nodes());
    let node = |n: &str, p: &str| (n.to_string(), vec![p.to_string()]);
    assert_eq!(
        placed(a.allocate(&mig_else_gpu("first"))),
        node("node-b", "r/mig=b-mig")
    );
    assert_eq!(
        placed(a.allocate(&mig_else_gpu("second"))),
        node("node-c", "r/mig=c-mig")
    );
    assert_eq!(
        placed(a.allocate(&mig_else_gpu("third"))),
        node("node-a", "r/gpu=a-gpu")
    );
    a.release("default", "third");
    let exact = claim_of("exact", vec![req("r", "gpu", 1, &[])]);
    assert_eq!(placed(a.allocate(&exact)), node("node-a", "r=a-gpu"));
}

/// The score adds up over a claim's `firstAvailable` requests: a node where one request
/// gets its first alternative and the other its second beats an earlier node where
/// both get their second; an `exactly` request adds nothing.
#[test]
fn first_available_scores_add_up_over_the_claims_requests() {
    let mut slices = pool("node-a", vec![devices(gpus(3))]);
    let mig = dev("b-mig", &[("type", "mig")]);
    slices.extend(pool(
        "node-b",
        vec![devices(vec![mig, dev("b-g0", &[]), dev("b-g1", &[])])],
    ));
    let mut a = allocator(&slices);
    let sub = |n: &str, class: &str| json!({"name": n, "deviceClassName": class});
    let fa = |name: &str| json!({"name": name, "firstAvailable": [sub("mig", "mig"), sub("gpu", "gpu")]});
    let claim = claim_of("c", vec![fa("x"), fa("y"), req("z", "gpu", 1, &[])]);
    assert_eq!(
        placed(a.allocate(&claim)),
        (
            "node-b".into(),
            vec!["x/mig=b-mig".into(), "y/gpu=b-g0".into(), "z=b-g1".into()]
        )
    );
}

/// A device of an `allNodes` slice is usable on every node, beside that node's own
/// devices: a claim for a node's GPU and the shared device fits on the first node, and
/// on the second once the first node's GPU is taken.
#[test]
fn an_all_nodes_device_joins_any_nodes_devices() {
    let mut slices = pool("node-a", vec![devices(vec![dev("a0", &[])])]);
    slices.extend(pool("node-b", vec![devices(vec![dev("b0", &[])])]));
    let fabric = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "fabric"},
        "spec": {"driver": D, "allNodes": true,
            "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
            "devices": [dev("f0", &[("type", "mig")])]}});
    slices.push(serde_json::from_value(fabric).unwrap());
    let mut a = allocator(&slices);
    let both = |n: &str| claim_of(n, vec![req("g", "gpu", 1, &[]), req("m", "mig", 1, &[])]);
    assert_eq!(
        placed(a.allocate(&both("first"))),
        ("node-a".into(), vec!["g=a0".into(), "m=f0".into()])
    );
    a.release("default", "first");
    a.allocate(&claim_of("gpu", vec![req("g", "gpu", 1, &[])]))
        .unwrap();
    assert_eq!(
        placed(a.allocate(&both("second"))),
        ("node-b".into(), vec!["g=b0".into(), "m=f0".into()])
    );
}

/// 1.34's DynamicResources plugin has no Score: the scheduler may bind a
/// `firstAvailable` claim to any node where it fits, whichever alternative that takes.
/// Plan keeps its first-fit node order there, so the first node, with the second
/// alternative.
#[test]
fn on_1_34_first_available_takes_the_first_node_where_it_fits() {
    let gates = FeatureGates::defaults(KubeVersion::new(34).unwrap());
    let mut a = Allocator::new(&a_gpu_node_then_two_mig_nodes(), &classes(), &gates).unwrap();
    assert_eq!(
        placed(a.allocate(&mig_else_gpu("first"))),
        ("node-a".into(), vec!["r/gpu=a-gpu".into()])
    );
    assert_eq!(
        placed(a.allocate(&mig_else_gpu("second"))),
        ("node-b".into(), vec!["r/mig=b-mig".into()])
    );
}

/// The allocation's config lists the class configs of the (sub)requests actually
/// allocated, named by `req/sub`, then the claim's own configs, in that order.
#[test]
fn allocation_config_lists_class_configs_then_claim_configs() {
    let mut a = allocator(&pool("n", vec![devices(gpus(1))]));
    let claim_cfg =
        json!({"requests": ["r"], "opaque": {"driver": D, "parameters": {"from": "claim"}}});
    let c = claim(
        "c",
        json!({
        "requests": [{"name": "r", "firstAvailable": [
            {"name": "mig", "deviceClassName": "mig"},
            {"name": "whole", "deviceClassName": "configured"}]}],
        "config": [claim_cfg]}),
    );
    let r = a.allocate(&c).unwrap();
    assert_eq!(picked(&r), ["r/whole=g0"]);
    let config = r.devices.unwrap().config.unwrap();
    let got: Vec<(String, Vec<String>, Value)> = config
        .into_iter()
        .map(|c| {
            (
                c.source,
                c.requests.unwrap(),
                c.opaque.unwrap().parameters.0,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "FromClass".into(),
                vec!["r/whole".into()],
                json!({"from": "class"})
            ),
            (
                "FromClaim".into(),
                vec!["r".into()],
                json!({"from": "claim"})
            ),
        ]
    );
}

/// A device must pass every selector of its class and every selector of the request:
/// each alone matches two devices here, together only one.
#[test]
fn class_and_request_selectors_must_both_match() {
    let mut a = allocator(&pool(
        "n",
        vec![devices(vec![
            dev("gpu-m1", &[("model", "m1")]),
            dev("mig-m2", &[("type", "mig"), ("model", "m2")]),
            dev("gpu-m2", &[("model", "m2")]),
        ])],
    ));
    let m2 = || vec![is("model", "m2")];
    let r = a.allocate(&claim_of("one", vec![req("r", "gpu", 1, &m2())]));
    assert_eq!(picked(&r.unwrap()), ["r=gpu-m2"]);
    a.release("default", "one");
    let why = unsatisfiable(a.allocate(&claim_of("two", vec![req("r", "gpu", 2, &m2())])));
    assert!(
        why.contains("1 device(s) match, 1 available, 2 needed"),
        "{why}"
    );
    // Both selectors of the class `gpu-m1` apply.
    let r = a.allocate(&claim_of("m1", vec![req("r", "gpu-m1", 0, &[])]));
    assert_eq!(picked(&r.unwrap()), ["r=gpu-m1"]);
    let why = unsatisfiable(a.allocate(&claim_of("x", vec![req("r", "gpu-m1", 0, &m2())])));
    assert!(why.contains("0 device(s) match"), "{why}");
}

/// A selector that fails on a device it reaches (an attribute the device lacks) fails
/// the claim as `Invalid`, as the scheduler's CEL runtime error does; a selector that
/// guards with `has()` skips that device instead.
#[test]
fn a_selector_error_fails_the_claim_unless_guarded() {
    let mut a = allocator(&pool(
        "n",
        vec![devices(vec![
            dev("bare", &[]),
            dev("fast", &[("tier", "fast")]),
        ])],
    ));
    let plain = claim_of("plain", vec![req("r", "gpu", 1, &[is("tier", "fast")])]);
    match a.allocate(&plain) {
        Err(AllocError::Invalid(why)) => {
            assert!(
                why.starts_with("device gpu.tessera.dev/n/bare: selector"),
                "{why}"
            );
            assert!(why.contains("No such key: tier"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    let guard = format!(
        r#"has(device.attributes["{D}"].tier) && {}"#,
        is("tier", "fast")
    );
    let guarded = a.allocate(&claim_of("guarded", vec![req("r", "gpu", 1, &[guard])]));
    assert_eq!(picked(&guarded.unwrap()), ["r=fast"]);
}

/// `matchAttribute` across two requests: when the first request's first choice has no
/// partner for the second, the search goes back and changes the first request's device.
#[test]
fn match_attribute_across_requests_backtracks_into_the_earlier_request() {
    let mut a = allocator(&pool(
        "n",
        vec![devices(vec![
            dev("g0", &[("numa", "0")]),
            dev("g1", &[("numa", "1")]),
            dev("m1", &[("type", "mig"), ("numa", "1")]),
        ])],
    ));
    let c = claim(
        "c",
        json!({
        "requests": [req("a", "gpu", 1, &[]), req("b", "mig", 1, &[])],
        "constraints": [{"matchAttribute": format!("{D}/numa")}]}),
    );
    assert_eq!(picked(&a.allocate(&c).unwrap()), ["a=g1", "b=m1"]);
}

/// A `matchAttribute` constraint binds only the requests it names, and a device
/// without the attribute cannot serve a bound request (it may serve an unbound one).
#[test]
fn match_attribute_binds_named_requests_and_needs_the_attribute() {
    let mut a = allocator(&pool(
        "n",
        vec![devices(vec![
            dev("bare", &[]),
            dev("g1", &[("numa", "0")]),
            dev("g2", &[("numa", "1")]),
            dev("g3", &[("numa", "0")]),
        ])],
    ));
    let c = claim(
        "c",
        json!({
        "requests": [req("a", "gpu", 1, &[]), req("b", "gpu", 1, &[]), req("c", "gpu", 1, &[])],
        "constraints": [{"matchAttribute": format!("{D}/numa"), "requests": ["a", "b"]}]}),
    );
    assert_eq!(picked(&a.allocate(&c).unwrap()), ["a=g1", "b=g3", "c=bare"]);
}

/// `distinctAttribute` also holds among the devices of one request: a count of 2 over
/// two NUMA values skips the second device of the first value; a count of 3 cannot fit.
#[test]
fn distinct_attribute_holds_within_one_request() {
    let mut a = allocator(&pool(
        "n",
        vec![devices(vec![
            dev("g0", &[("numa", "0")]),
            dev("g1", &[("numa", "0")]),
            dev("g2", &[("numa", "1")]),
        ])],
    ));
    let spread = |name: &str, count: i64| {
        claim(
            name,
            json!({"requests": [req("r", "gpu", count, &[])],
            "constraints": [{"distinctAttribute": format!("{D}/numa")}]}),
        )
    };
    let why = unsatisfiable(a.allocate(&spread("three", 3)));
    assert!(why.contains("cannot be satisfied together"), "{why}");
    assert_eq!(
        picked(&a.allocate(&spread("two", 2)).unwrap()),
        ["r=g0", "r=g2"]
    );
}

/// The memory slices of one GPU as counters, `n` of them.
fn slices_set(n: u32) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("memory-slice-{i}"), "1".to_string()))
        .collect()
}

fn refs(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect()
}

/// A partition and the whole GPU exclude each other through the counters they share,
/// in both layouts: counter sets in a slice of their own (1.35+), and counter sets
/// beside their devices (1.34).
#[test]
fn a_partition_and_the_whole_gpu_exclude_each_other_in_both_layouts() {
    let all = slices_set(4);
    let set = counter_set("gpu-0-counters", &refs(&all));
    let gpu_devices = vec![
        with(dev("gpu-0", &[]), consumes("gpu-0-counters", &refs(&all))),
        with(
            dev("part-0", &[("type", "mig")]),
            consumes("gpu-0-counters", &refs(&all[..2])),
        ),
        with(
            dev("part-1", &[("type", "mig")]),
            consumes("gpu-0-counters", &refs(&all[2..])),
        ),
    ];
    let split = pool("n", vec![set.clone(), devices(gpu_devices.clone())]);
    let mut combined = pool("n", vec![devices(gpu_devices)]);
    combined[0].spec.shared_counters = pool("n", vec![set])[0].spec.shared_counters.clone();
    for (slices, minor) in [(split, 37), (combined, 34)] {
        let gates = FeatureGates::defaults(KubeVersion::new(minor).unwrap());
        let mut a = Allocator::new(&slices, &classes(), &gates).unwrap();
        assert_eq!(a.skipped_pools(), [], "1.{minor}");
        let part = |n: &str| claim_of(n, vec![req("r", "mig", 1, &[])]);
        let whole = |n: &str| claim_of(n, vec![req("r", "gpu", 1, &[])]);
        assert_eq!(
            picked(&a.allocate(&part("p")).unwrap()),
            ["r=part-0"],
            "1.{minor}"
        );
        let why = unsatisfiable(a.allocate(&whole("w")));
        assert!(
            why.contains("1 device(s) match, 0 available"),
            "1.{minor}: {why}"
        );
        a.release("default", "p");
        assert_eq!(
            picked(&a.allocate(&whole("w")).unwrap()),
            ["r=gpu-0"],
            "1.{minor}"
        );
        let why = unsatisfiable(a.allocate(&part("p2")));
        assert!(
            why.contains("2 device(s) match, 0 available"),
            "1.{minor}: {why}"
        );
    }
}

/// Counters add up per counter: a device fits only if every counter it consumes stays
/// within its set's total, whatever room the other counters have.
#[test]
fn every_counter_must_stay_within_its_set() {
    let set = counter_set("c", &[("memory", "100Gi"), ("multiprocessors", "132")]);
    let part = |n: &str, mem: &str, sm: &str, profile: &str| {
        let d = dev(n, &[("type", "mig"), ("profile", profile)]);
        with(
            d,
            consumes("c", &[("memory", mem), ("multiprocessors", sm)]),
        )
    };
    let mut a = allocator(&pool(
        "n",
        vec![
            set,
            devices(vec![
                part("3g-0", "40Gi", "60", "3g"),
                part("3g-1", "40Gi", "60", "3g"),
                part("3g-2", "40Gi", "60", "3g"),
                part("1g-0", "10Gi", "16", "1g"),
            ]),
        ],
    ));
    let of = |n: &str, p: &str| claim_of(n, vec![req("r", "mig", 1, &[is("profile", p)])]);
    assert_eq!(picked(&a.allocate(&of("a", "3g")).unwrap()), ["r=3g-0"]);
    assert_eq!(picked(&a.allocate(&of("b", "3g")).unwrap()), ["r=3g-1"]);
    // 80Gi + 40Gi > 100Gi.
    unsatisfiable(a.allocate(&of("c", "3g")));
    // 80Gi + 10Gi fits the memory, but 120 + 16 multiprocessors exceed 132.
    unsatisfiable(a.allocate(&of("d", "1g")));
    a.release("default", "b");
    assert_eq!(picked(&a.allocate(&of("d", "1g")).unwrap()), ["r=1g-0"]);
}

/// Counter sets belong to their pool: two pools with a set of the same name are
/// counted apart.
#[test]
fn counter_sets_are_counted_per_pool() {
    let all = slices_set(2);
    let node = |n: &str| {
        pool(
            n,
            vec![
                counter_set("gpu-0-counters", &refs(&all)),
                devices(vec![
                    with(dev("gpu-0", &[]), consumes("gpu-0-counters", &refs(&all))),
                    with(
                        dev("part", &[("type", "mig")]),
                        consumes("gpu-0-counters", &refs(&all)),
                    ),
                ]),
            ],
        )
    };
    let mut slices = node("node-a");
    slices.extend(node("node-b"));
    let mut a = allocator(&slices);
    let whole = a
        .allocate(&claim_of("w", vec![req("r", "gpu", 1, &[])]))
        .unwrap();
    assert_eq!(
        (picked(&whole), node_of(&whole)),
        (vec!["r=gpu-0".into()], "node-a".into())
    );
    let part = a
        .allocate(&claim_of("p", vec![req("r", "mig", 1, &[])]))
        .unwrap();
    assert_eq!(
        (picked(&part), node_of(&part)),
        (vec!["r=part".into()], "node-b".into())
    );
}

/// A multi-allocatable device consumes its counters once, while at least one share of
/// it is allocated: two shares of the whole GPU block its partition together, and the
/// partition is free again only when the last share is released.
#[test]
fn a_shared_device_holds_its_counters_once_while_shared() {
    let all = slices_set(2);
    let shared = with(
        dev("gpu-0", &[("type", "gpu-shared")]),
        json!({"allowMultipleAllocations": true, "capacity": {"memory": {"value": "80Gi"}},
            "consumesCounters": consumes("c", &refs(&all))["consumesCounters"]}),
    );
    let part = with(
        dev("part", &[("type", "mig")]),
        consumes("c", &refs(&all[..1])),
    );
    let mut a = allocator(&pool(
        "n",
        vec![counter_set("c", &refs(&all)), devices(vec![shared, part])],
    ));
    let share = |n: &str| claim_of(n, vec![cap_req("r", "shared", &[("memory", "10Gi")])]);
    let mig = || claim_of("p", vec![req("r", "mig", 1, &[])]);
    assert_eq!(picked(&a.allocate(&share("s1")).unwrap()), ["r=gpu-0"]);
    assert_eq!(picked(&a.allocate(&share("s2")).unwrap()), ["r=gpu-0"]);
    unsatisfiable(a.allocate(&mig()));
    a.release("default", "s1");
    unsatisfiable(a.allocate(&mig()));
    a.release("default", "s2");
    assert_eq!(picked(&a.allocate(&mig()).unwrap()), ["r=part"]);
    // And the partition keeps the shared GPU out in turn.
    unsatisfiable(a.allocate(&share("s3")));
}

/// A capacity's request policy decides what one allocation consumes: a range rounds up
/// to `min + n·step`, a request rounding above `max` makes the device ineligible (the
/// next device serves it), `validValues` take the smallest value not below the request,
/// and no request takes the default.
#[test]
fn request_policies_round_or_refuse_a_capacity_request() {
    let device = |name: &str, policy: Value| {
        with(
            dev(name, &[("type", "gpu-shared")]),
            json!({"allowMultipleAllocations": true,
                "capacity": {"compute": {"value": "100", "requestPolicy": policy}}}),
        )
    };
    let ranged = json!({"default": "10", "validRange": {"min": "10", "max": "40", "step": "10"}});
    let valued = json!({"default": "100", "validValues": ["25", "50", "100"]});
    let mut a = allocator(&pool(
        "n",
        vec![devices(vec![
            device("ranged", ranged),
            device("valued", valued),
        ])],
    ));
    let mut check = |name: &str, caps: &[(&str, &str)], device: &str, consumed: &str| {
        let r = a
            .allocate(&claim_of(name, vec![cap_req("r", "shared", caps)]))
            .unwrap();
        let res = &results(&r)[0];
        let cc = res.consumed_capacity.as_ref().unwrap();
        assert_eq!(
            (res.device.as_str(), cc["compute"].0.as_str()),
            (device, consumed),
            "{name}"
        );
    };
    check("a", &[("compute", "15")], "ranged", "20");
    check("b", &[("compute", "45")], "valued", "50");
    check("c", &[], "ranged", "10");
}

/// A request rounded to a step is a new quantity even when it is already on a step, in
/// the release's format: 1.37 writes it in the step's format (`NewQuantity(v,
/// validRange.Step.Format)`), 1.34–1.36 in BinarySI. Found by tests/cluster's
/// scenario-plan-agreement.sh: on the real 1.37.2 scheduler, examples/claims/
/// shared-gpus.yaml's `memory: 20Gi` on Tessera's `step: "1048576"` was recorded as
/// `21474836480` where `tessera plan` printed `20Gi`. Below `min` the result is `min` as
/// written; a policy's default and a device without a policy are copied as written.
#[test]
fn a_stepped_request_is_written_in_the_releases_format() {
    // As Tessera publishes a shared H100 (src/publish/slices.rs): DecimalSI steps.
    let device = with(
        dev("s0", &[("type", "gpu-shared")]),
        json!({"allowMultipleAllocations": true, "capacity": {
            "memory": {"value": "85520809984", "requestPolicy": {"default": "85520809984",
                "validRange": {"min": "1048576", "step": "1048576"}}},
            "compute": {"value": "100", "requestPolicy": {"default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"}}},
            "binary": {"value": "80Gi", "requestPolicy": {"default": "80Gi",
                "validRange": {"min": "1Mi", "step": "1Mi"}}}}}),
    );
    let slices = pool("n", vec![devices(vec![device])]);
    let consumed = |minor: u32, caps: &[(&str, &str)]| -> Vec<String> {
        let gates = FeatureGates::parse(
            KubeVersion::new(minor).unwrap(),
            "DRAConsumableCapacity=true",
        )
        .unwrap();
        let mut a = Allocator::new(&slices, &classes(), &gates).unwrap();
        let r = a
            .allocate(&claim_of("c", vec![cap_req("r", "shared", caps)]))
            .unwrap();
        let cc = results(&r)[0].consumed_capacity.clone().unwrap();
        ["memory", "compute", "binary"]
            .iter()
            .map(|k| cc[*k].0.clone())
            .collect()
    };
    let on_step = [("memory", "20Gi"), ("compute", "25"), ("binary", "20Gi")];
    assert_eq!(consumed(37, &on_step), ["21474836480", "25", "20Gi"]);
    for minor in [34, 35, 36] {
        assert_eq!(
            consumed(minor, &on_step),
            ["20Gi", "25", "20Gi"],
            "1.{minor}"
        );
    }
    // Off a step: rounded up, same formats.
    let off_step = [
        ("memory", "1500Ki"),
        ("compute", "2500m"),
        ("binary", "1500Ki"),
    ];
    assert_eq!(consumed(37, &off_step), ["2097152", "3", "2Mi"]);
    assert_eq!(consumed(34, &off_step), ["2Mi", "3", "2Mi"]);
    // Below min: min as written; nothing asked: the defaults as written.
    assert_eq!(
        consumed(37, &[("memory", "1"), ("binary", "1")]),
        ["1048576", "0", "1Mi"]
    );
    assert_eq!(consumed(34, &[("memory", "1")]), ["1048576", "0", "80Gi"]);
}

/// 1.34's allocator checks a pick's capacity on the wrong device: the one at the pick's
/// index within its request (0 for a request's first device) in the chosen device's
/// slice (`allocateDevice` passes `r.deviceIndex` to `CmpRequestOverCapacity`, every
/// 1.34.x; 1.35 passes the device). Found by tests/cluster/scenario-plan-agreement.sh:
/// on the real 1.34.4 scheduler with gpu-1 shared, examples/claims/shared-gpus.yaml's
/// `light` was unschedulable ("some requested capacity has not been defined", at -v=7:
/// gpu-0, first in the slice, has no `compute`) where `tessera plan` allocated gpu-1;
/// `whole` (no request) was allocated. So on 1.34 a capacity request fails unless the
/// slice's first device has those capacities, and requests without one are checked
/// against that device's usage as well as against the shared device's own (the search
/// loop checks the chosen device first).
#[test]
fn on_1_34_capacity_is_checked_on_the_slice_device_at_the_picks_index() {
    let shared = with(
        dev("s1", &[("type", "gpu-shared")]),
        json!({"allowMultipleAllocations": true, "capacity": {
            "memory": {"value": "80Gi"}, "compute": {"value": "100"}}}),
    );
    let plain = with(
        dev("g0", &[]),
        json!({"capacity": {"memory": {"value": "16Gi"}}}),
    );
    let gates = |minor: u32| {
        FeatureGates::parse(
            KubeVersion::new(minor).unwrap(),
            "DRAConsumableCapacity=true",
        )
        .unwrap()
    };
    let asking = || claim_of("ask", vec![cap_req("r", "shared", &[("memory", "20Gi")])]);
    let whole = |n: &str| claim_of(n, vec![cap_req("r", "shared", &[])]);

    // The shared device second: on 1.34 g0 (16Gi, no compute) is checked.
    let second = pool("n", vec![devices(vec![plain.clone(), shared.clone()])]);
    let mut a = Allocator::new(&second, &classes(), &gates(34)).unwrap();
    assert!(unsatisfiable(a.allocate(&asking())).contains("0 available"));
    let r = a.allocate(&whole("w1")).unwrap();
    assert_eq!(picked(&r), ["r=s1"]);
    let cc = results(&r)[0].consumed_capacity.clone().unwrap();
    assert_eq!(
        (cc["memory"].0.as_str(), cc["compute"].0.as_str()),
        ("80Gi", "100")
    );
    // The search loop checks s1 itself too: s1 is full, a second whole share does not
    // fit (no overcommit; the wrong-device check only refuses more).
    unsatisfiable(a.allocate(&whole("w2")));

    // 1.35 checks s1 itself.
    let mut a = Allocator::new(&second, &classes(), &gates(35)).unwrap();
    assert_eq!(picked(&a.allocate(&asking()).unwrap()), ["r=s1"]);
    unsatisfiable(a.allocate(&whole("w1")));

    // The shared device first: on 1.34 the check happens to hit it.
    let first = pool("n", vec![devices(vec![shared, plain])]);
    let mut a = Allocator::new(&first, &classes(), &gates(34)).unwrap();
    assert_eq!(picked(&a.allocate(&asking()).unwrap()), ["r=s1"]);
    unsatisfiable(a.allocate(&whole("w1")));
}

/// On 1.34 a request's second pick is checked on device 1 of the chosen device's slice:
/// with each shared device alone in its slice (Tessera's 1.34 layout), that index is
/// past the end, where the Go scheduler panics; `plan` says so instead of guessing. In
/// one slice the index exists (the second device, checked with its own usage).
#[test]
fn on_1_34_a_second_pick_past_the_slice_end_would_crash_the_scheduler() {
    let shared = |n: &str| {
        with(
            dev(n, &[("type", "gpu-shared")]),
            json!({"allowMultipleAllocations": true, "capacity": {"memory": {"value": "80Gi",
                "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Mi"}}}}}),
        )
    };
    let gates = |minor: u32| {
        FeatureGates::parse(
            KubeVersion::new(minor).unwrap(),
            "DRAConsumableCapacity=true",
        )
        .unwrap()
    };
    let mut two = cap_req("r", "shared", &[("memory", "1Gi")]);
    two["exactly"]["count"] = json!(2);
    let two = claim_of("two", vec![two]);
    let alone = pool(
        "n",
        vec![devices(vec![shared("s1")]), devices(vec![shared("s2")])],
    );
    let mut a = Allocator::new(&alone, &classes(), &gates(34)).unwrap();
    match a.allocate(&two) {
        Err(e @ AllocError::SchedulerCrash(_)) => {
            assert!(e.to_string().contains("index 1"), "{e}")
        }
        other => panic!("expected SchedulerCrash, got {other:?}"),
    }
    // One shared device alone (the mock node's gpu-1): 1.34 takes it again for the
    // second pick (each pick scans all devices), and crashes on index 1. Seen on the
    // real v1.34.4: "index out of range [1] with length 1" in CmpRequestOverCapacity.
    let one = pool("n", vec![devices(vec![shared("s1")])]);
    let mut a = Allocator::new(&one, &classes(), &gates(34)).unwrap();
    assert!(matches!(
        a.allocate(&two),
        Err(AllocError::SchedulerCrash(_))
    ));
    // 1.35 takes two shares of it; 1.36+ go on after a pick: distinct devices.
    let mut a = Allocator::new(&one, &classes(), &gates(35)).unwrap();
    assert_eq!(picked(&a.allocate(&two).unwrap()), ["r=s1", "r=s1"]);
    let mut a = Allocator::new(&one, &classes(), &gates(36)).unwrap();
    unsatisfiable(a.allocate(&two));
    // A count-1 share is fine there, and 1.35 has no such index.
    assert_eq!(
        picked(
            &a.allocate(&claim_of(
                "one",
                vec![cap_req("r", "shared", &[("memory", "1Gi")])]
            ))
            .unwrap()
        ),
        ["r=s1"]
    );
    let mut a = Allocator::new(&alone, &classes(), &gates(35)).unwrap();
    assert_eq!(picked(&a.allocate(&two).unwrap()), ["r=s1", "r=s1"]);
    // In one slice, index 1 exists: s1 twice, the second share also checked on s2.
    let together = pool("n", vec![devices(vec![shared("s1"), shared("s2")])]);
    let mut a = Allocator::new(&together, &classes(), &gates(34)).unwrap();
    assert_eq!(picked(&a.allocate(&two).unwrap()), ["r=s1", "r=s1"]);
}

/// Two requests of one claim may share a multi-allocatable device, each with its own
/// shareID and its own consumed capacity; a capacity without a policy is consumed as
/// asked; one request's devices stay distinct, and capacity runs out exactly at the
/// device's value.
#[test]
fn one_claim_may_share_a_device_across_requests_until_capacity_runs_out() {
    let shared = with(
        dev("s0", &[("type", "gpu-shared")]),
        json!({"allowMultipleAllocations": true, "capacity": {"memory": {"value": "80Gi"}}}),
    );
    let mut a = allocator(&pool("n", vec![devices(vec![shared])]));
    fn mem(m: &str) -> [(&str, &str); 1] {
        [("memory", m)]
    }
    let both = claim_of(
        "both",
        vec![
            cap_req("a", "shared", &mem("30Gi")),
            cap_req("b", "shared", &mem("30Gi")),
        ],
    );
    let r = a.allocate(&both).unwrap();
    assert_eq!(picked(&r), ["a=s0", "b=s0"]);
    let [ra, rb] = results(&r) else { panic!() };
    let consumed = |x: &DeviceRequestAllocationResult| {
        x.consumed_capacity.clone().unwrap()["memory"].0.clone()
    };
    assert_eq!((consumed(ra), consumed(rb)), ("30Gi".into(), "30Gi".into()));
    assert!(ra.share_id.is_some() && rb.share_id.is_some());
    assert_ne!(ra.share_id, rb.share_id);
    // One request cannot take the same device twice.
    let mut two = cap_req("r", "shared", &mem("1Gi"));
    two["exactly"]["count"] = json!(2);
    unsatisfiable(a.allocate(&claim_of("twice", vec![two])));
    // 20Gi are left: 21Gi does not fit, 20Gi does, then nothing does.
    let why = unsatisfiable(a.allocate(&claim_of("c", vec![cap_req("r", "shared", &mem("21Gi"))])));
    assert!(
        why.contains("1 device(s) match, 0 available, 1 needed"),
        "{why}"
    );
    assert!(
        a.allocate(&claim_of("d", vec![cap_req("r", "shared", &mem("20Gi"))]))
            .is_ok()
    );
    unsatisfiable(a.allocate(&claim_of("e", vec![cap_req("r", "shared", &mem("1"))])));
    // Releasing gives the capacity back.
    a.release("default", "both");
    assert!(
        a.allocate(&claim_of("f", vec![cap_req("r", "shared", &mem("60Gi"))]))
            .is_ok()
    );
}

/// shareIDs look like lowercase v4 UUIDs and are deterministic: the same claims in
/// the same order get the same shareIDs, and no two allocations get the same one.
#[test]
fn share_ids_are_deterministic_uuids() {
    let shared = with(
        dev("s0", &[("type", "gpu-shared")]),
        json!({"allowMultipleAllocations": true, "capacity": {"memory": {"value": "80Gi"}}}),
    );
    let slices = pool("n", vec![devices(vec![shared])]);
    let run = || -> Vec<String> {
        let mut a = allocator(&slices);
        ["x", "y", "x2"]
            .iter()
            .map(|n| {
                let r = a.allocate(&claim_of(
                    n,
                    vec![cap_req("r", "shared", &[("memory", "1Gi")])],
                ));
                results(&r.unwrap())[0].share_id.clone().unwrap()
            })
            .collect()
    };
    let ids = run();
    assert_eq!(ids, run());
    for id in &ids {
        let groups: Vec<&str> = id.split('-').collect();
        let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        assert_eq!(lens, [8, 4, 4, 4, 12], "{id}");
        assert!(
            id.bytes()
                .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{id}"
        );
        assert!(
            groups[2].starts_with('4') && groups[3].starts_with('8'),
            "{id}"
        );
    }
    let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "{ids:?}");
}

/// Without `DRAConsumableCapacity` a multi-allocatable device is allocated like any
/// other: whole, once, without shareID or consumedCapacity.
#[test]
fn without_consumable_capacity_a_multi_allocatable_device_is_exclusive() {
    let shared = with(
        dev("s0", &[("type", "gpu-shared")]),
        json!({"allowMultipleAllocations": true, "capacity": {"memory": {"value": "80Gi"}}}),
    );
    let gates = FeatureGates::parse(KubeVersion::NEWEST, "DRAConsumableCapacity=false").unwrap();
    let mut a =
        Allocator::new(&pool("n", vec![devices(vec![shared])]), &classes(), &gates).unwrap();
    let share = |n: &str| claim_of(n, vec![cap_req("r", "shared", &[("memory", "1Gi")])]);
    let r = a.allocate(&share("a")).unwrap();
    let res = &results(&r)[0];
    assert_eq!(
        (res.device.as_str(), &res.share_id, &res.consumed_capacity),
        ("s0", &None, &None)
    );
    unsatisfiable(a.allocate(&share("b")));
}

/// A capacity request on a plain device is a minimum: the device must publish that
/// capacity with at least that value; nothing is reported as consumed.
#[test]
fn a_capacity_request_on_a_plain_device_is_a_minimum() {
    let sized =
        |n: &str, mem: &str| with(dev(n, &[]), json!({"capacity": {"memory": {"value": mem}}}));
    let mut a = allocator(&pool(
        "n",
        vec![devices(vec![sized("t4", "16Gi"), sized("h100", "80Gi")])],
    ));
    let r = a
        .allocate(&claim_of(
            "big",
            vec![cap_req("r", "gpu", &[("memory", "40Gi")])],
        ))
        .unwrap();
    let res = &results(&r)[0];
    assert_eq!(
        (res.device.as_str(), &res.share_id, &res.consumed_capacity),
        ("h100", &None, &None)
    );
    let why = unsatisfiable(a.allocate(&claim_of(
        "odd",
        vec![cap_req("r", "gpu", &[("bandwidth", "1")])],
    )));
    assert!(why.contains("2 device(s) match, 0 available"), "{why}");
}

/// Only the newest generation of a pool counts, and only when all its slices are
/// there: an incomplete newest generation skips the pool even if an older one is
/// complete.
#[test]
fn only_the_newest_complete_generation_of_a_pool_is_used() {
    let mut old = pool("n", vec![devices(vec![dev("old", &[])])]);
    let mut new = pool("n", vec![devices(vec![dev("new", &[])])]);
    new[0].metadata.name = Some("n-new".into());
    new[0].spec.pool.generation = 2;
    old.extend(new.clone());
    let mut a = allocator(&old);
    let r = a.allocate(&claim_of("a", vec![req("r", "gpu", 1, &[])]));
    assert_eq!(picked(&r.unwrap()), ["r=new"]);
    unsatisfiable(a.allocate(&claim_of("b", vec![req("r", "gpu", 1, &[])])));

    old.last_mut().unwrap().spec.pool.resource_slice_count = 2;
    let a = Allocator::new(&old, &classes(), &gates()).unwrap();
    let skipped = a.skipped_pools();
    assert_eq!(skipped.len(), 1);
    assert_eq!(
        (
            skipped[0].driver.as_str(),
            skipped[0].pool.as_str(),
            skipped[0].reason.as_str()
        ),
        (D, "n", "incomplete pool: 1 of 2 slices of generation 2")
    );
}

/// A pool that breaks its release's layout is skipped with the reason (devices beside
/// counter sets from 1.35; counter sets in another slice on 1.34) while other pools
/// still serve claims.
#[test]
fn a_pool_breaking_the_release_layout_is_skipped_and_others_still_serve() {
    let all = slices_set(1);
    let part = with(dev("p", &[]), consumes("c", &refs(&all)));
    let mut combined = pool("bad", vec![devices(vec![part.clone()])]);
    combined[0].spec.shared_counters = pool("x", vec![counter_set("c", &refs(&all))])[0]
        .spec
        .shared_counters
        .clone();
    let split = pool(
        "bad",
        vec![counter_set("c", &refs(&all)), devices(vec![part])],
    );
    for (mut slices, minor, reason) in [
        (
            combined,
            37,
            "slice 0 has both devices and sharedCounters, which Kubernetes 1.35+ forbids",
        ),
        (
            split,
            34,
            r#"device "p" in slice 1 consumes from counter set "c" of slice 0; Kubernetes 1.34 needs it in the same slice"#,
        ),
    ] {
        slices.extend(pool("good", vec![devices(vec![dev("g", &[])])]));
        let gates = FeatureGates::defaults(KubeVersion::new(minor).unwrap());
        let mut a = Allocator::new(&slices, &classes(), &gates).unwrap();
        let skipped = a.skipped_pools();
        assert_eq!(skipped.len(), 1, "1.{minor}");
        assert_eq!(skipped[0].pool, "bad");
        assert_eq!(skipped[0].reason, format!("invalid pool: {reason}"));
        let r = a
            .allocate(&claim_of("c", vec![req("r", "gpu", 1, &[])]))
            .unwrap();
        assert_eq!(
            (picked(&r), node_of(&r)),
            (vec!["r=g".into()], "good".into())
        );
    }
}

/// A failed `firstAvailable` request names each subrequest, with its class and how many
/// devices match, are free and are needed.
#[test]
fn a_failed_first_available_names_every_subrequest() {
    let mut a = allocator(&pool("n", vec![devices(gpus(1))]));
    let c = claim_of(
        "c",
        vec![json!({"name": "r", "firstAvailable": [
        {"name": "pair", "deviceClassName": "gpu", "count": 2},
        {"name": "part", "deviceClassName": "mig"}]})],
    );
    assert_eq!(
        unsatisfiable(a.allocate(&c)),
        r#"request "r/pair" (class gpu): 1 device(s) match, 1 available, 2 needed / request "r/part" (class mig): 0 device(s) match, 0 available, 1 needed"#
    );
}

/// A malformed claim is `Invalid` with what is wrong, never `Unsatisfiable`.
#[test]
fn malformed_claims_are_invalid() {
    let mut a = allocator(&pool("n", vec![devices(gpus(1))]));
    let both =
        json!({"matchAttribute": format!("{D}/numa"), "distinctAttribute": format!("{D}/numa")});
    let cases = [
        (
            json!({"requests": [req("r", "gpu", 1, &[])], "constraints": [both]}),
            "a constraint needs exactly one of matchAttribute, distinctAttribute",
        ),
        (
            json!({"requests": [{"name": "r"}]}),
            "request r: neither exactly nor firstAvailable",
        ),
        (
            json!({"requests": [{"name": "r", "firstAvailable": [{"name": "x", "deviceClassName": "nope"}]}]}),
            "request r/x: device class nope does not exist",
        ),
        (
            json!({"requests": [cap_req("r", "gpu", &[("memory", "lots")])]}),
            r#"request r: invalid quantity "lots""#,
        ),
    ];
    for (devices, want) in cases {
        match a.allocate(&claim("c", devices)) {
            Err(AllocError::Invalid(why)) => assert!(why.starts_with(want), "{why}"),
            other => panic!("{want}: {other:?}"),
        }
    }
}

/// The search stops at its step budget with `SearchLimit`, allocating nothing; with a
/// larger budget the same claim fits.
#[test]
fn the_search_stops_at_its_step_limit() {
    let mut a = allocator(&pool("n", vec![devices(gpus(4))]));
    let four = claim_of("four", vec![req("r", "gpu", 4, &[])]);
    a.step_limit = 3;
    assert_eq!(a.allocate(&four).unwrap_err(), AllocError::SearchLimit(3));
    a.step_limit = 100;
    assert_eq!(
        picked(&a.allocate(&four).unwrap()),
        ["r=g0", "r=g1", "r=g2", "r=g3"]
    );
}

/// Releasing a claim frees every device allocated under its name: allocating a claim
/// name a second time must not leave the first allocation's devices taken for good
/// (the second allocation may be refused or replace the first).
#[test]
fn releasing_a_claim_frees_everything_allocated_under_its_name() {
    let mut a = allocator(&pool("n", vec![devices(gpus(3))]));
    let one = claim_of("a", vec![req("r", "gpu", 1, &[])]);
    assert_eq!(picked(&a.allocate(&one).unwrap()), ["r=g0"]);
    let _ = a.allocate(&one);
    assert!(a.release("default", "a"));
    let all = a.allocate(&claim_of("all", vec![req("r", "gpu", 3, &[])]));
    assert_eq!(picked(&all.unwrap()), ["r=g0", "r=g1", "r=g2"]);
}
