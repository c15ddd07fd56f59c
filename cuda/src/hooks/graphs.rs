//! Graph memory: charged when upload or launch materializes it, released by trims.
//! Graph work: the blocks of a graph's kernel nodes, summed at instantiation and
//! charged to the claim's token bucket at every launch.
#![allow(non_snake_case)]

use super::pools::settle_retained;
use super::*;
use crate::enforce::throttle::{self, Work, grid_blocks};

/// `CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
const GRAPH_MEM_RESERVED_CURRENT: c_int = 2;
/// Offsets in `CUDA_MEM_ALLOC_NODE_PARAMS` (x86-64): the pool props' location type
/// and id, and `bytesize`.
const ALLOC_NODE_LOCATION_TYPE: usize = 8;
const ALLOC_NODE_LOCATION_ID: usize = 12;
const ALLOC_NODE_BYTESIZE: usize = 104;

/// The memory a device's graph pool holds (`RESERVED_MEM_CURRENT`).
fn graph_reserved(dev: CUdevice) -> Option<u64> {
    let p = driver(DriverFn::DeviceGetGraphMemAttribute);
    if p == 0 {
        return None;
    }
    let mut v: u64 = 0;
    // SAFETY: cuDeviceGetGraphMemAttribute(CUdevice, attr, void*) with a u64 attribute.
    let f: unsafe extern "C" fn(CUdevice, c_int, *mut c_void) -> CUresult = unsafe { as_fn(p) };
    // SAFETY: valid out pointer of the attribute's type.
    let rc = unsafe { f(dev, GRAPH_MEM_RESERVED_CURRENT, (&mut v as *mut u64).cast()) };
    (rc == CUDA_SUCCESS).then_some(v)
}

fn settle_graph_pool(st: &State, dev: CUdevice, pending: Option<Charge>) -> bool {
    settle_retained(st, Kind::GraphPool, dev as u64, pending, || {
        graph_reserved(dev)
    })
}

/// Remembers what an allocation node adds to its graph (its size in 2 MiB pages,
/// on the node's device).
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut c_void,
    graph: *mut c_void,
    deps: *const c_void,
    ndeps: usize,
    params: *mut u8,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphAddMemAllocNode,
        unsafe extern "C" fn(*mut c_void, *mut c_void, *const c_void, usize, *mut u8) -> CUresult,
        node,
        graph,
        deps,
        ndeps,
        params
    );
    if rc == CUDA_SUCCESS && !params.is_null() {
        // SAFETY: the driver accepted `params`, a CUDA_MEM_ALLOC_NODE_PARAMS.
        let (ty, id, bytes) = unsafe {
            (
                params
                    .add(ALLOC_NODE_LOCATION_TYPE)
                    .cast::<c_int>()
                    .read_unaligned(),
                params
                    .add(ALLOC_NODE_LOCATION_ID)
                    .cast::<c_int>()
                    .read_unaligned(),
                params
                    .add(ALLOC_NODE_BYTESIZE)
                    .cast::<usize>()
                    .read_unaligned(),
            )
        };
        if ty == CU_MEM_LOCATION_TYPE_DEVICE {
            allocations::add_graph_need(graph as u64, id, sizes::linear(bytes as u64));
        }
    }
    rc
}

/// An executable graph inherits its graph's memory needs, and runs its kernel nodes
/// (summed now, by walking the graph: stream-captured graphs count too).
fn instantiated(rc: CUresult, exec: *mut *mut c_void, graph: *mut c_void) {
    if rc != CUDA_SUCCESS || exec.is_null() {
        return;
    }
    // SAFETY: on success the driver wrote *exec.
    let e = unsafe { *exec } as u64;
    if let Some(n) = allocations::graph_need(graph as u64) {
        allocations::add_graph_need(e, n.dev, n.bytes);
    }
    if accounting::state().active() {
        throttle::set_graph_work(e, graph_work(graph));
    }
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    err_node: *mut c_void,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphInstantiate,
        unsafe extern "C" fn(
            *mut *mut c_void,
            *mut c_void,
            *mut c_void,
            *mut c_char,
            usize,
        ) -> CUresult,
        exec,
        graph,
        err_node,
        log,
        log_size
    );
    instantiated(rc, exec, graph);
    rc
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    err_node: *mut c_void,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphInstantiate_v2,
        unsafe extern "C" fn(
            *mut *mut c_void,
            *mut c_void,
            *mut c_void,
            *mut c_char,
            usize,
        ) -> CUresult,
        exec,
        graph,
        err_node,
        log,
        log_size
    );
    instantiated(rc, exec, graph);
    rc
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    flags: u64,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphInstantiateWithFlags,
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> CUresult,
        exec,
        graph,
        flags
    );
    instantiated(rc, exec, graph);
    rc
}

type InstantiateParamsFn =
    unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *mut c_void) -> CUresult;

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    params: *mut c_void,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphInstantiateWithParams,
        InstantiateParamsFn,
        exec,
        graph,
        params
    );
    instantiated(rc, exec, graph);
    rc
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    params: *mut c_void,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphInstantiateWithParams_ptsz,
        InstantiateParamsFn,
        exec,
        graph,
        params
    );
    instantiated(rc, exec, graph);
    rc
}

type ExecStreamFn = unsafe extern "C" fn(*mut c_void, CUstream) -> CUresult;

/// Upload and launch materialize graph memory: the growth the graph can cause (its
/// needs beyond what the device's graph pool is charged for) is reserved first,
/// then the charge follows the pool's reserved size. A launch is first charged the
/// blocks of the graph's kernel nodes.
fn materialize(h: Hook, exec: *mut c_void, stream: CUstream) -> CUresult {
    let p = real(h);
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    if matches!(h, Hook::cuGraphLaunch | Hook::cuGraphLaunch_ptsz)
        && let Some(w) = throttle::graph_work_of(exec as u64)
    {
        throttle::launch(&DriverDevices, w.blocks, w.kernels, None);
    }
    // SAFETY: the driver's function of this variant.
    let f: ExecStreamFn = unsafe { as_fn(p) };
    let st = accounting::state();
    let need = if st.active() {
        allocations::graph_need(exec as u64)
    } else {
        None
    };
    let Some(need) = need else {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { f(exec, stream) };
    };
    let held = allocations::peek(Kind::GraphPool, need.dev as u64).map_or(0, |e| e.charge.bytes);
    let growth = need.bytes.saturating_sub(held);
    let plan = if growth > 0 {
        match plan(Some(need.dev), growth, "cuGraphLaunch") {
            Ok(p) => p,
            Err(rc) => return rc,
        }
    } else {
        Plan::Forward
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { f(exec, stream) };
    let pending = match plan {
        Plan::Charged(_, c) if rc == CUDA_SUCCESS => Some(c),
        Plan::Charged(st, c) => {
            st.release(c);
            None
        }
        Plan::Forward => None,
    };
    if !settle_graph_pool(st, need.dev, pending) {
        // The launch grew the graph pool past the budget: once the graph has run, its
        // allocations are freed into the pool, and a trim returns what the budget
        // cannot hold. The launch itself cannot be undone.
        let _ = sync_stream(stream_of(
            stream,
            matches!(h, Hook::cuGraphLaunch_ptsz | Hook::cuGraphUpload_ptsz),
        ));
        let t = real(Hook::cuDeviceGraphMemTrim);
        if t != 0 {
            // SAFETY: cuDeviceGraphMemTrim(CUdevice).
            let f: unsafe extern "C" fn(CUdevice) -> CUresult = unsafe { as_fn(t) };
            // SAFETY: as above.
            unsafe { f(need.dev) };
        }
        if !settle_graph_pool(st, need.dev, None) {
            stderr::log(format_args!(
                "graph memory grew past the budget during a launch and could not be trimmed"
            ));
        }
    }
    rc
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphUpload(exec: *mut c_void, stream: CUstream) -> CUresult {
    materialize(Hook::cuGraphUpload, exec, stream)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphUpload_ptsz(exec: *mut c_void, stream: CUstream) -> CUresult {
    materialize(Hook::cuGraphUpload_ptsz, exec, stream)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: *mut c_void, stream: CUstream) -> CUresult {
    materialize(Hook::cuGraphLaunch, exec, stream)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: *mut c_void, stream: CUstream) -> CUresult {
    materialize(Hook::cuGraphLaunch_ptsz, exec, stream)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: *mut c_void) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphExecDestroy,
        unsafe extern "C" fn(*mut c_void) -> CUresult,
        exec
    );
    if rc == CUDA_SUCCESS {
        allocations::drop_graph_need(exec as u64);
        throttle::drop_graph_work(exec as u64);
    }
    rc
}

/// Trimming returns the graph pool's unused memory; the charge follows.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    let rc = call_real!(
        Hook::cuDeviceGraphMemTrim,
        unsafe extern "C" fn(CUdevice) -> CUresult,
        dev
    );
    let st = accounting::state();
    if st.active() {
        let _ = settle_graph_pool(st, dev, None);
    }
    rc
}

// ---- graph work: the kernel nodes a launch of the graph runs --------------------

/// `CU_GRAPH_NODE_TYPE_KERNEL` and `_GRAPH` (a child graph).
const NODE_KERNEL: i32 = 0;
const NODE_CHILD_GRAPH: i32 = 4;
/// Child graphs nest at most this deep before the walk stops.
const MAX_GRAPH_DEPTH: u32 = 8;
/// `CUDA_KERNEL_NODE_PARAMS(_v2)`: gridDimX, Y, Z after the function handle.
const KERNEL_NODE_GRID: usize = 8;

/// Sums the kernel nodes of `graph` (child graphs included) with
/// `cuGraphGetNodes`/`cuGraphNodeGetType`/`cuGraphKernelNodeGetParams(_v2)`. Works for
/// stream-captured graphs too. Without those driver functions the graph costs nothing.
fn graph_work(graph: *mut c_void) -> Work {
    let mut w = Work::default();
    walk(graph, 0, &mut w);
    w
}

fn walk(graph: *mut c_void, depth: u32, w: &mut Work) {
    let (gn, gt) = (
        driver(DriverFn::GraphGetNodes),
        driver(DriverFn::GraphNodeGetType),
    );
    if gn == 0 || gt == 0 || graph.is_null() {
        return;
    }
    type GetNodes = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut usize) -> CUresult;
    type GetType = unsafe extern "C" fn(*mut c_void, *mut i32) -> CUresult;
    // SAFETY: cuGraphGetNodes(CUgraph, CUgraphNode*, size_t*), cuGraphNodeGetType(CUgraphNode, CUgraphNodeType*).
    let (get_nodes, get_type): (GetNodes, GetType) = unsafe { (as_fn(gn), as_fn(gt)) };
    let mut n: usize = 0;
    // SAFETY: a NULL node array asks for the count.
    if unsafe { get_nodes(graph, std::ptr::null_mut(), &mut n) } != CUDA_SUCCESS || n == 0 {
        return;
    }
    let mut nodes: Vec<*mut c_void> = vec![std::ptr::null_mut(); n];
    // SAFETY: room for n nodes; the driver writes back how many it wrote.
    if unsafe { get_nodes(graph, nodes.as_mut_ptr(), &mut n) } != CUDA_SUCCESS {
        return;
    }
    nodes.truncate(n);
    for node in nodes {
        let mut ty: i32 = -1;
        // SAFETY: a node of this graph; valid out pointer.
        if unsafe { get_type(node, &mut ty) } != CUDA_SUCCESS {
            continue;
        }
        match ty {
            NODE_KERNEL => {
                if let Some(b) = kernel_node_blocks(node) {
                    w.blocks = w.blocks.saturating_add(b);
                    w.kernels += 1;
                }
            }
            NODE_CHILD_GRAPH if depth < MAX_GRAPH_DEPTH => {
                let p = driver(DriverFn::GraphChildGraphNodeGetGraph);
                if p == 0 {
                    continue;
                }
                let mut child: *mut c_void = std::ptr::null_mut();
                // SAFETY: cuGraphChildGraphNodeGetGraph(CUgraphNode, CUgraph*).
                let f: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> CUresult =
                    unsafe { as_fn(p) };
                // SAFETY: valid out pointer.
                if unsafe { f(node, &mut child) } == CUDA_SUCCESS {
                    walk(child, depth + 1, w);
                }
            }
            _ => {}
        }
    }
}

/// A kernel node's thread blocks, from `cuGraphKernelNodeGetParams_v2` (72-byte
/// params) or the v1 call (56 bytes): both put the grid at the same offsets.
fn kernel_node_blocks(node: *mut c_void) -> Option<u64> {
    for f in [
        DriverFn::GraphKernelNodeGetParamsV2,
        DriverFn::GraphKernelNodeGetParams,
    ] {
        let p = driver(f);
        if p == 0 {
            continue;
        }
        // Larger than either params struct, zeroed.
        let mut buf = [0u64; 32];
        // SAFETY: cuGraphKernelNodeGetParams(_v2)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS(_v2)*).
        let g: unsafe extern "C" fn(*mut c_void, *mut u8) -> CUresult = unsafe { as_fn(p) };
        // SAFETY: the buffer is larger than the params the driver writes.
        if unsafe { g(node, buf.as_mut_ptr().cast()) } == CUDA_SUCCESS {
            // Little-endian u32s at bytes 8, 12, 16: words 1 (low, high) and 2 (low).
            let w = |o: usize| buf[o / 8] >> (8 * (o % 8)) & 0xffff_ffff;
            return Some(grid_blocks(
                w(KERNEL_NODE_GRID) as u32,
                w(KERNEL_NODE_GRID + 4) as u32,
                w(KERNEL_NODE_GRID + 8) as u32,
            ));
        }
    }
    None
}
